"""mkdocs hook: the repository's files and folders that a page cites, published with the site.

A page links to files the way the repository holds them, so that the same markdown works on the built site
and where it is read in the repository itself:

* a file outside ``docs/`` (a benchmark's result, ``../benchmarks/results/compression.json``) is copied
  into the site under ``repository/<its path>`` and the link points there;
* a folder (a run directory of a bundled report, ``runs/ptb-word-lstm-s1``) gets a generated page that
  lists its files, each linked, and the link points to that page.

Every such target must be part of the repository: a link to a missing file, to a file that git ignores,
to anything outside the repository, or to a markdown page outside ``docs/`` (which would need a place in
the nav) fails the build. Links to pages and files inside ``docs/`` are left to mkdocs' own validation.
"""

from __future__ import annotations

import posixpath
import re
import subprocess
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, InclusionLevel

LINK = re.compile(r"\]\(([^)\s\"]+)")  # as moglm.report.bundle.LINK and tests/test_docs.py read links
PREFIX = "repository"

_published: dict[Path, str] = {}  # a cited file outside docs/ -> its path in the site
_listings: dict[Path, str] = {}  # a cited folder -> the site path of its listing page


def _paths(config) -> tuple[Path, Path]:
    return Path(config.config_file_path).resolve().parent, Path(config.docs_dir).resolve()


def _relative_links(text: str) -> list[str]:
    return [link for link in LINK.findall(text) if "://" not in link and not link.startswith(("#", "mailto:"))]


def _committed(root: Path, folder: Path) -> list[Path]:
    """The files of ``folder`` that belong to the repository (all of them outside a git checkout)."""
    if (root / ".git").exists():
        done = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--", str(folder)],
                              capture_output=True, text=True, check=True)
        return sorted(root / name for name in done.stdout.split("\0") if name)
    return sorted(p for p in folder.rglob("*") if p.is_file())


def _ignored(root: Path, paths: list[Path]) -> set[Path]:
    if not (root / ".git").exists() or not paths:
        return set()
    done = subprocess.run(["git", "-C", str(root), "check-ignore", "--stdin"], input="\n".join(map(str, paths)),
                          capture_output=True, text=True)
    return {Path(line) for line in done.stdout.splitlines()}


def _site_path(target: Path, root: Path, docs: Path) -> str:
    """Where ``target`` lives in the site: its path under docs/, or under ``repository/``."""
    if target == docs or docs in target.parents:
        return target.relative_to(docs).as_posix()
    return f"{PREFIX}/{target.relative_to(root).as_posix()}"


def on_files(files, config):
    root, docs = _paths(config)
    _published.clear()
    _listings.clear()
    problems, folders = [], set()
    for file in files.documentation_pages():
        page = Path(file.abs_src_path)
        for link in _relative_links(page.read_text(encoding="utf-8")):
            target = (page.parent / link.split("#")[0]).resolve()
            inside_docs = target == docs or docs in target.parents
            if root not in target.parents and target != root:
                problems.append(f"{file.src_uri}: {link} is outside the repository")
            elif target.is_dir():
                if not (target / "index.md").is_file():
                    folders.add(target)
            elif inside_docs:
                continue  # mkdocs validates it
            elif not target.is_file():
                problems.append(f"{file.src_uri}: {link} is not a file of the repository")
            elif target.suffix == ".md":
                problems.append(f"{file.src_uri}: {link} is a page outside docs/; move it into docs/ and the nav")
            else:
                _published[target] = _site_path(target, root, docs)
    for folder in sorted(folders):
        members = _committed(root, folder)
        if not members:
            problems.append(f"{folder.relative_to(root)}: a cited folder with no file of the repository")
        _listings[folder] = f"{_site_path(folder, root, docs)}/index.md"
        for member in members:
            if not (member == docs or docs in member.parents):
                _published[member] = _site_path(member, root, docs)
    for target in _ignored(root, list(_published)):
        problems.append(f"{target.relative_to(root)}: cited by a page but ignored by git (not in the repository)")
    if problems:
        raise PluginError("links that cannot be published with the site:\n  " + "\n  ".join(problems))
    for target, uri in sorted(_published.items()):
        files.append(File.generated(config, uri, abs_src_path=str(target)))
    for folder, uri in sorted(_listings.items()):
        listing = File.generated(config, uri, content=_listing(root, folder), inclusion=InclusionLevel.NOT_IN_NAV)
        files.append(listing)
    return files


def _listing(root: Path, folder: Path) -> str:
    """A page that lists ``folder``'s files, each linked (relative to the page, which sits in the folder)."""
    lines = [f"# `{folder.relative_to(root).as_posix()}/`", "", "The files of this folder in the repository:", ""]
    for member in _committed(root, folder):
        name = member.relative_to(folder).as_posix()
        lines.append(f"- [`{name}`]({name})")
    return "\n".join(lines) + "\n"


def on_page_markdown(markdown, page, config, files):
    root, docs = _paths(config)
    if page.file.abs_src_path is None:
        return markdown  # a generated listing: its links are its folder's files, beside it in the site
    source = Path(page.file.abs_src_path)
    here = posixpath.dirname(page.file.src_uri)

    def rewrite(match: re.Match) -> str:
        link = match.group(1)
        if "://" in link or link.startswith(("#", "mailto:")):
            return match.group(0)
        path, sep, anchor = link.partition("#")
        target = (source.parent / path).resolve()
        if target in _listings:
            uri = _listings[target]
        elif target in _published:
            uri = _published[target]
        else:
            return match.group(0)
        return f"]({posixpath.relpath(uri, here or '.')}{sep}{anchor}"

    return LINK.sub(rewrite, markdown)
