"""Where a result came from: every result file moglm writes (a run's ``results.json``, an experiment's
evaluations, ``moglm dyneval``'s report, a benchmark's JSON) records the machine, the command, the code and
the seed that made it under ``"provenance"``, so that a number in a report can be traced to its file and
rerun (``docs/fidelity.md``).

Paths in the command are written relative to the working folder (or ``~``), never as this machine's
absolute paths, so that result files can be committed and read elsewhere.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from .atomic import atomic_write_text

KEY = "provenance"


def cpu_name() -> str:
    """The processor's model name, as ``lscpu`` shows it ("Model name"), else the platform's word for it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine() -> dict[str, Any]:
    """The CPU's model name, its cores and the cores this process may use, and the GPU if torch sees one."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        usable = os.cpu_count()
    out: dict[str, Any] = {"cpu": cpu_name(), "cores": os.cpu_count(), "usable_cores": usable,
                           "system": platform.system()}
    torch = sys.modules.get("torch")
    if torch is not None:
        out["threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            out["gpu"] = torch.cuda.get_device_name()
    return out


def portable(arg: str) -> str:
    """``arg`` with this machine's working folder and home folder written as relative and ``~`` paths."""
    for folder, short in ((Path.cwd(), ""), (Path.home(), "~/")):
        prefix = str(folder).rstrip("/") + "/"
        if prefix != "/" and prefix in arg:
            arg = arg.replace(prefix, short or "")
    return arg


def command() -> str:
    """The command line that is running, as the user typed it, with portable paths: ``moglm ...`` for the
    command-line tool wherever it is installed, ``python benchmarks/x.py ...`` for a script of the working folder."""
    argv = list(sys.argv) or ["python"]
    program = Path(argv[0]).name
    moglm = program == "moglm" or argv[0].endswith(os.path.join("moglm", "__main__.py"))
    script = portable(str(Path(argv[0]).resolve()))
    if moglm:
        head = ["moglm"]
    elif program.endswith(".py") and not Path(script).is_absolute():  # a script of the working folder (or ~)
        head = ["python", script]
    else:  # anything else by its name alone: no path of this machine
        head = [program]
    return shlex.join(head + [portable(a) for a in argv[1:]])


@functools.lru_cache(maxsize=1)
def code() -> dict[str, Any]:
    """moglm's version and, in a git checkout, the commit it runs (and whether tracked files had changed)."""
    from . import __version__

    out: dict[str, Any] = {"moglm": __version__, "commit": None, "dirty": None}
    root = Path(__file__).resolve().parent.parent
    if (root / ".git").exists():
        try:
            head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                  timeout=10, check=True).stdout.strip()
            status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True, timeout=10, check=True).stdout.strip()
            out["commit"], out["dirty"] = head, bool(status)
        except (OSError, subprocess.SubprocessError):
            pass
    return out


def provenance(seed: int | None = None) -> dict[str, Any]:
    """The record written under ``"provenance"``: machine, command, code, library versions, seed and time."""
    torch = sys.modules.get("torch")
    return {"machine": machine(), "command": command(), **code(),
            "torch": getattr(torch, "__version__", None), "python": platform.python_version(), "seed": seed,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def stamped(data: dict[str, Any], seed: int | None = None) -> dict[str, Any]:
    """``data`` with its provenance (a copy; an existing record is replaced)."""
    return {**{k: v for k, v in data.items() if k != KEY}, KEY: provenance(seed)}


def write_result(path: str | Path, data: dict[str, Any], seed: int | None = None) -> Path:
    """Write the result ``data`` as indented JSON with its provenance, atomically."""
    return atomic_write_text(path, json.dumps(stamped(data, seed), indent=1))
