"""mkdocs hook: the source map, generated from the package at build time.

A page marks where the map goes with ``<!-- source-map -->`` on a line of its own; it becomes one table row
per module of ``moglm`` (and per shipped-file folder), with the first sentence of the module's docstring.
Nothing of it is written by hand, so a module that moves or is added shows up at the next build, and a module
without a docstring fails the build.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from mkdocs.exceptions import PluginError

MARKER = re.compile(r"^<!-- source-map -->$", re.MULTILINE)
PACKAGE = Path(__file__).resolve().parents[2] / "moglm"


def on_page_markdown(markdown, page, config, files):
    if not MARKER.search(markdown):
        return markdown
    return MARKER.sub(lambda _: source_map(page.file.src_uri), markdown)


def _summary(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    if not doc:
        raise PluginError(f"source map: {path.relative_to(PACKAGE.parent)} has no docstring")
    first = " ".join(doc.split("\n\n")[0].split())
    sentence = re.split(r"(?<=[.:;])\s+(?=[A-Z`(])", first)[0]
    return sentence.replace("|", "\\|")


def source_map(where: str) -> str:
    rows = ["| module | what it holds |", "| --- | --- |"]
    for path in sorted(PACKAGE.rglob("*.py"), key=lambda p: (p.parent.relative_to(PACKAGE).parts, p.name)):
        if path.name == "__main__.py":
            continue
        rows.append(f"| `{path.relative_to(PACKAGE.parent).as_posix()}` | {_summary(path)} |")
    for folder in sorted({p.parent for p in PACKAGE.rglob("*.toml")}):
        rows.append(f"| `{folder.relative_to(PACKAGE.parent).as_posix()}/*.toml` | shipped files "
                    f"({len(list(folder.glob('*.toml')))}) |")
    return "\n".join(rows)
