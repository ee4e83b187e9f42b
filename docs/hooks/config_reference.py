"""mkdocs hook: the configuration reference, generated from the config types at build time.

A page marks where a reference goes with an HTML comment on a line of its own:

* ``<!-- config-reference: moglm.runs.config:RunConfig -->``: the keys of a pydantic model (or a
  dataclass), section by section (a nested model is a ``[section]``, a list of them ``[[section]]``, a
  mapping of them ``[section.<name>]``), each key with its type, constraints, default and description;
* ``<!-- config-reference: cell-options -->``: the ``[model.cell]`` options of every architecture, from
  its ``Options`` dataclass.

Nothing of it is written by hand, so the reference cannot drift from the code: a field added, renamed or
re-documented shows up at the next build, and a type that moved fails the build.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import re
import types
import typing
from typing import Any

from mkdocs.exceptions import PluginError

MARKER = re.compile(r"^<!-- config-reference: (?P<target>[\w.:-]+) -->$", re.MULTILINE)


def on_page_markdown(markdown, page, config, files):
    def expand(match: re.Match) -> str:
        target = match.group("target")
        try:
            if target == "cell-options":
                return cell_options()
            module, _, name = target.partition(":")
            return reference(getattr(importlib.import_module(module), name))
        except Exception as e:  # a type that moved or broke: the build fails and says which
            raise PluginError(f"{page.file.src_uri}: config reference {target}: {type(e).__name__}: {e}") from e

    return MARKER.sub(expand, markdown)


# -- one type ---------------------------------------------------------------------------------------------
def reference(cls: type, heading: str = "###") -> str:
    """The tables of ``cls``: its own keys, then each nested section under its own heading."""
    blocks = []
    for path, section, note in _sections(cls):
        rows = _rows(section)
        if not rows:
            continue
        title = f"{heading} `{path}`\n\n" if path else ""
        about = " ".join(filter(None, [_doc(section), note]))
        blocks.append(title + (f"{_escape(about)}\n\n" if about else "") + _table(rows))
    return "\n\n".join(blocks)


def cell_options() -> str:
    """One table per architecture: the fields of its ``Options`` (``[model.cell]``)."""
    from moglm.model.architectures import MODEL_ARCHITECTURES

    blocks, bare = [], []
    for name, cls in sorted(MODEL_ARCHITECTURES.items()):
        rows = _rows(cls.Options)
        if rows:
            blocks.append(f"### `{name}` ({cls.__name__})\n\n{_table(rows)}")
        else:
            bare.append(f"`{name}`")
    if bare:
        blocks.append(f"No options of their own: {', '.join(bare)}.")
    return "\n\n".join(blocks)


def _sections(cls: type, key: str = "", heading: str = "", note: str = "") -> list[tuple[str, type, str]]:
    """``(heading, type, note)`` for ``cls`` and every section nested in it, depth first; ``key`` is the
    dotted key of ``cls`` (``model``, ``scales.<name>``)."""
    out = [(heading, cls, note)]
    for name, annotation, _, _ in _fields(cls):
        nested = _model_in(annotation)
        if nested is None:
            continue
        kind, inner = nested
        dotted = f"{key}.{name}" if key else name
        if kind == "section":
            out += _sections(inner, dotted, f"[{dotted}]")
        elif kind == "list":
            out += _sections(inner, dotted, f"[[{dotted}]]", "Each entry of the list is a table with these keys.")
        else:
            out += _sections(inner, f"{dotted}.<name>", f"[{dotted}.<name>]", "One table per name.")
    return out


def _model_in(annotation) -> tuple[str, type] | None:
    """``("section" | "list" | "mapping", the nested config type)`` when ``annotation`` holds one."""
    if _is_config(annotation):
        return "section", annotation
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is list and args and _is_config(args[0]):
        return "list", args[0]
    if origin is dict and len(args) == 2 and _is_config(args[1]):
        return "mapping", args[1]
    return None


def _is_config(kind) -> bool:
    from pydantic import BaseModel

    return isinstance(kind, type) and (issubclass(kind, BaseModel) or dataclasses.is_dataclass(kind))


# -- fields -----------------------------------------------------------------------------------------------
def _fields(cls: type) -> list[tuple[str, Any, Any, str]]:
    """``(key, annotation, default, description)`` of every field of a pydantic model or a dataclass."""
    from pydantic import BaseModel

    if isinstance(cls, type) and issubclass(cls, BaseModel):
        out = []
        for name, f in cls.model_fields.items():
            if f.default_factory is not None:
                default = f.default_factory()
            elif f.is_required():
                default = _REQUIRED
            else:
                default = f.default
            out.append((f.alias or name, f.annotation, default, f.description or "", f.metadata))
        return [(k, a, d, _with_constraints(desc, meta)) for k, a, d, desc, meta in out]
    comments = _trailing_comments(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = _REQUIRED
        out.append((f.name, f.type, default, f.metadata.get("help") or comments.get(f.name, "")))
    return out


class _Required:
    def __repr__(self) -> str:
        return "required"


_REQUIRED = _Required()


def _with_constraints(description: str, metadata: list) -> str:
    """The description with the field's bounds (``>= 1``, ``< 1``, at least n items) after it."""
    words = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    bounds = []
    for item in metadata:
        for attr, word in words.items():
            if getattr(item, attr, None) is not None:
                bounds.append(f"{word} {getattr(item, attr)}")
        if getattr(item, "min_length", None) is not None:
            bounds.append(f"at least {item.min_length} entries")
    return description + (f" ({', '.join(bounds)})" if bounds else "")


def _trailing_comments(cls: type) -> dict[str, str]:
    """A dataclass's field comments: ``name: type = default  # the comment``."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    out = {}
    for line in source.splitlines():
        m = re.match(r"^\s+(\w+)\s*:[^#]*#\s*(.+)$", line)
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


def _rows(cls: type) -> list[tuple[str, str, str, str]]:
    rows = []
    for name, annotation, default, description in _fields(cls):
        nested = _model_in(annotation)
        if nested is not None and nested[0] == "section":
            continue  # a section of its own
        rows.append((f"`{name}`", _type(annotation), _default(default, nested), _escape(description)))
    return rows


def _table(rows: list[tuple[str, str, str, str]]) -> str:
    lines = ["| key | type | default | description |", "| --- | --- | --- | --- |"]
    lines += [f"| {' | '.join(row)} |" for row in rows]
    return "\n".join(lines)


def _type(annotation) -> str:
    """A type as a config file's reader needs it: ``int``, ``"word" or "char"``, ``list of int``."""
    if isinstance(annotation, str):  # a dataclass under ``from __future__ import annotations``
        return _escape(annotation.replace("typing.", "").replace(" | None", " or null").replace(" | ", " or "))
    return _escape(_type_words(annotation))


def _type_words(annotation) -> str:
    if annotation is type(None):
        return "null"
    if annotation is Any:
        return "any"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " or ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_words(a) for a in args)
    if origin is list:
        return f"list of {_type_words(args[0])}" if args else "list"
    if origin is tuple:
        return f"[{', '.join(_type_words(a) for a in args)}]"
    if origin is dict:
        return f"table of {_type_words(args[1])}" if args else "table"
    if _is_config(annotation):
        return "table"
    return getattr(annotation, "__name__", str(annotation))


def _default(value, nested) -> str:
    if value is _REQUIRED:
        return "required"
    try:
        text = json.dumps(value if not isinstance(value, tuple) else list(value))
    except TypeError:
        text = repr(value)
    return f"`{text}`"


def _doc(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    own = cls.__dict__.get("__doc__")
    if not own or doc.startswith(("Usage docs:", "A base class for creating Pydantic models")):
        return ""  # inherited (pydantic's own, or a base section's): says nothing of this section
    return " ".join(own.split())


def _escape(text: str) -> str:
    """Text safe in a markdown table cell: no pipes, no line breaks, no raw HTML."""
    return " ".join(str(text).split()).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
