"""Where corpora (and tokenizers, and datasets folders) named by a relative path are looked up."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import MoglmError


def data_search_path() -> list[Path]:
    """Where relative corpus paths are looked up: the working directory, ``$MOGLM_DATA``, and the
    ``shared/data`` folder beside the project checkout."""
    roots = [Path.cwd()]
    if os.environ.get("MOGLM_DATA"):
        roots.append(Path(os.environ["MOGLM_DATA"]))
    roots.append(Path(__file__).resolve().parents[3] / "shared" / "data")
    return roots


def _candidates(path: str | os.PathLike) -> list[Path]:
    p = Path(path).expanduser()
    return [p] if p.is_absolute() else [root / p for root in data_search_path()]


def find_local(path: str | os.PathLike) -> Path | None:
    """The first existing ``root / path`` over :func:`data_search_path` (absolute paths as they are), or ``None``."""
    return next((c.resolve() for c in _candidates(path) if c.exists()), None)


def resolve_path(path: str | os.PathLike) -> Path:
    """:func:`find_local`, or a one-line error naming the places searched."""
    found = find_local(path)
    if found is not None:
        return found
    candidates = _candidates(path)
    where = ", ".join(str(c) for c in candidates)
    raise MoglmError(f"corpus {str(path)!r} not found (looked in: {where}; set MOGLM_DATA to its folder)")
