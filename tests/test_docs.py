"""Every number is traceable: README and docs link only to files committed in the repository (none ignored by
git, none outside it), each linked number equals the number in the file it cites, and no committed result holds
this machine's absolute paths. The docs site holds every page in its nav, names no tracker number, and README
stays a landing page whose test command is the one CI runs."""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import pytest

from moglm.report.bundle import LINK

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SITE_PAGES = sorted(p for p in DOCS.rglob("*.md") if DOCS / "hooks" not in p.parents)
PAGES = [ROOT / "README.md", *SITE_PAGES]
TEST_COMMAND = "python -m pytest -q"
NUMBER = re.compile(r"\[\*{0,2}(-?[\d,]*\.?\d+)\*{0,2}\]\(([^)\s\"]+)")


def _links(page: Path) -> list[str]:
    return [link for link in LINK.findall(page.read_text()) if "://" not in link and not link.startswith(("#", "mailto:"))]


def _ignored(paths: list[Path]) -> set[Path]:
    """Those of ``paths`` that git ignores (empty outside a git checkout)."""
    if not (ROOT / ".git").exists() or not paths:
        return set()
    done = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--stdin"], input="\n".join(map(str, paths)),
                          capture_output=True, text=True)
    return {Path(line) for line in done.stdout.splitlines()}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_of_a_page_is_a_committed_file_of_the_repository(page):
    targets = {link: (page.parent / link.split("#")[0]).resolve() for link in _links(page)}
    outside = [link for link, t in targets.items() if t != ROOT and ROOT not in t.parents]
    missing = [link for link, t in targets.items() if not t.exists()]
    ignored = _ignored([t for t in targets.values() if t.exists() and ROOT in t.parents])
    assert not outside and not missing, (outside, missing)
    assert not [link for link, t in targets.items() if t in ignored]
    if page != ROOT / "README.md":  # a page outside docs/ has no place in the site's nav
        assert not [link for link, t in targets.items() if t.suffix == ".md" and DOCS not in t.parents]


def _leaves(value) -> list[float]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _leaves(v)]
    if isinstance(value, list):
        return [x for v in value for x in _leaves(v)]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [float(value)]
    return []


def _matches(text: str, data) -> bool:
    """Whether some number of ``data`` (or the perplexity of a cross-entropy in it) shows as ``text``."""
    digits = len(text.split(".")[1]) if "." in text else 0
    wanted = float(text.replace(",", ""))
    leaves = _leaves(data)
    candidates = leaves + [math.exp(x) for x in leaves if 0 < x < 20]
    return any(abs(round(x, digits) - wanted) < 10 ** -digits / 2 + 1e-12 for x in candidates)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_linked_number_equals_the_number_in_the_file_it_cites(page):
    wrong = []
    for text, link in NUMBER.findall(page.read_text()):
        target = (page.parent / link.split("#")[0]).resolve()
        if target.suffix == ".json" and target.is_file():
            if not _matches(text, json.loads(target.read_text())):
                wrong.append(f"{text} -> {link}")
    assert not wrong


def test_committed_results_hold_no_absolute_path_of_a_machine():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the committed files are not known")
    # a path where a JSON value or a command's argument starts: after a quote, a space, "=" or "("
    pattern = "([\"[:space:]=(]|^)/(root|home|work|tmp|Users)/"
    found = subprocess.run(["git", "-C", str(ROOT), "grep", "-l", "-E", pattern, "--", "docs", "benchmarks/results",
                            "README.md"], capture_output=True, text=True).stdout.split()
    assert not found


def _nav_pages(node) -> list[str]:
    if isinstance(node, str):
        return [node] if node.endswith(".md") else []
    if isinstance(node, dict):
        return [page for value in node.values() for page in _nav_pages(value)]
    if isinstance(node, list):
        return [page for value in node for page in _nav_pages(value)]
    return []


def test_the_site_holds_every_page_in_its_nav_and_only_pages_that_exist():
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["docs_dir"] == "docs"
    nav = _nav_pages(config["nav"])
    pages = {p.relative_to(DOCS).as_posix() for p in SITE_PAGES}
    assert len(nav) == len(set(nav))
    assert set(nav) == pages, (sorted(pages - set(nav)), sorted(set(nav) - pages))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_names_a_tracker_number(page):
    """The docs speak of the project alone: no "issue 12", no "#34"."""
    text = page.read_text()
    found = re.findall(r"\bissues? #?\d+|(?<![&\w/])#\d+\b", text, flags=re.IGNORECASE)
    assert not found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_page_holds_no_path_of_a_machine(page):
    """The project stands alone: no absolute path of a machine, nothing beside the checkout."""
    text = page.read_text()
    assert not re.findall(r"(?<![\w.~])/(?:root|home|work|tmp|Users)/|\.\./shared\b", text)


def test_the_project_stands_alone():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the committed files are not known")
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True).stdout.split()
    assert not [f for f in files if Path(f).name.upper() == "NOTES.MD"]


def test_readme_is_a_landing_page_whose_test_command_ci_runs():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    commands = [line.split("#")[0].strip() for line in readme.splitlines()]
    assert TEST_COMMAND in commands
    ci = [line.split("#")[0].strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert TEST_COMMAND in ci
    assert any(line.startswith("mkdocs build --strict") for line in ci)
