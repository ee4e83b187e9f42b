"""The benchmarks behind ``moglm bench`` (each writes a JSON report and prints a markdown table)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Callable


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds of ``call()`` and its result."""
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result


def command_line() -> str | None:
    """The command that is running, without this machine's paths (``moglm bench ...``, ``python benchmarks/x.py
    ...``): the one the results' provenance records (:func:`moglm.provenance.command`)."""
    if not sys.argv or not sys.argv[0]:
        return None
    from ..provenance import command

    return command()


def default_out(name: str) -> Path:
    """Where ``moglm bench`` writes ``name`` unless told: ``$MOGLM_BENCH_DIR`` or ``~/.cache/moglm/bench``."""
    if os.environ.get("MOGLM_BENCH_DIR"):
        return Path(os.environ["MOGLM_BENCH_DIR"]) / name
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "moglm" / "bench" / name


def write_report(report: dict[str, Any], out_path: str | Path | None) -> None:
    """Write ``report`` as JSON to ``out_path`` atomically (nothing when ``out_path`` is None)."""
    if out_path:
        from ..provenance import write_result

        write_result(Path(out_path), report)
