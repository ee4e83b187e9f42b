"""Faults injected inside a checkpoint write, for the fault suite and ``benchmarks/faults.py``.

:func:`inject` makes the ``nth`` arrival at one stage of :class:`moglm.runs.checkpoints.CheckpointStore`'s
write either fail as a full disk does (``"enospc"``: ``OSError(ENOSPC)`` after half the file is written,
as a write that ran out of room leaves it) or kill the process there (``"kill"``: SIGKILL, the half-written
file left where it was, as ``kill -9`` or a power cut would). Only names inside
:mod:`moglm.runs.checkpoints` are replaced, so nothing else the process writes is touched.

:func:`drop_file_override` lets a process running as root meet read-only folders as their owner does.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import signal
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from moglm.runs import checkpoints

#: stage -> what is being written when the fault strikes, in the order a checkpoint is written
STAGES = {
    "model weights": "model.safetensors, in the checkpoint's temporary folder",
    "training tensors": "training.safetensors (optimizer, random generators, carried state)",
    "state": "state.json",
    "manifest": "manifest.json (the checksums)",
    "folder rename": "the complete temporary folder, before it is renamed into place",
    "previous pointer": "previous.json (the fallback), before last.json moves",
    "last pointer": "last.json",
    "best pointer": "best.json, after last.json moved",
    "pruning": "the removal of a checkpoint no pointer refers to (kill only)",
}
ACTIONS = ("enospc", "kill")


def _strike(action: str, path: Path) -> None:
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def _half(path: Path) -> None:
    """Cut ``path`` to half its length: what a write cut short leaves."""
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


@contextmanager
def inject(stage: str, action: str, nth: int = 1) -> Iterator[None]:
    """Strike at the ``nth`` time (1-based) the checkpoint writer reaches ``stage`` (a key of :data:`STAGES`)."""
    if stage not in STAGES or action not in ACTIONS or (stage == "pruning" and action != "kill"):
        raise ValueError(f"no such fault: {action} at {stage!r}")
    seen = 0

    def arrive(name: str) -> bool:
        nonlocal seen
        if name == stage:
            seen += 1
        return name == stage and seen == nth

    real_save, real_directory, real_pointer = checkpoints.save_file, checkpoints.atomic_directory, \
        checkpoints.atomic_write_text
    real_write_text = Path.write_text

    def save_file(tensors, filename, *args, **kwargs):
        real_save(tensors, filename, *args, **kwargs)
        path = Path(filename)
        if arrive({"model": "model weights", "training": "training tensors"}.get(path.stem, "")):
            _half(path)
            _strike(action, path)

    def write_text(self: Path, text: str, *args, **kwargs):  # state.json and manifest.json of a checkpoint
        written = real_write_text(self, text, *args, **kwargs)
        if self.parent.name.startswith(".tmp-step-") and arrive(self.stem):
            _half(self)
            _strike(action, self)
        return written

    @contextmanager
    def atomic_directory(path):
        with real_directory(path) as tmp:
            yield tmp
            if arrive("folder rename"):
                _strike(action, tmp)

    def atomic_write_text(path, text):
        path = Path(path)
        if arrive(f"{path.stem} pointer"):
            partial = path.parent / f".{path.name}.injected.tmp{path.suffix}"  # as atomic_write names it
            partial.write_text(text[: len(text) // 2])
            if action == "enospc":
                partial.unlink()  # atomic_write removes its temporary when the write fails
            _strike(action, path)
        return real_pointer(path, text)

    def rmtree(path, *args, **kwargs):
        files = sorted(Path(path).glob("*")) if Path(path).name.startswith("step-") else []
        if files and arrive("pruning"):
            files[0].unlink()  # the removal is under way
            _strike(action, Path(path))
        return shutil.rmtree(path, *args, **kwargs)

    replaced: list[tuple[object, str, Callable | types.ModuleType]] = [
        (checkpoints, "save_file", save_file), (checkpoints, "atomic_directory", atomic_directory),
        (checkpoints, "atomic_write_text", atomic_write_text), (Path, "write_text", write_text),
        (checkpoints, "shutil", types.SimpleNamespace(rmtree=rmtree)),
    ]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in replaced]
    for owner, name, value in replaced:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def drop_file_override() -> None:
    """Give up root's power to ignore file modes (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER): root then
    meets a read-only folder as its owner does, and still reads what it owns (its own Python, say)."""
    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    libc = ctypes.CDLL(None, use_errno=True)
    header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3
    keep = ~0b1110 & 0xFFFFFFFF
    if libc.capget(ctypes.byref(header), data) == 0:
        data[0].effective &= keep
        data[0].permitted &= keep
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


#: exit code of ``python fault_injection.py ...`` when root could not give up its file override
CANNOT_DROP_OVERRIDE = 77


if __name__ == "__main__":  # ``python fault_injection.py ARGS``: ``moglm ARGS`` meeting file modes as their owner
    import sys

    if os.geteuid() == 0:
        try:
            drop_file_override()
        except OSError as exc:
            print(f"cannot drop root's file override here: {exc}", file=sys.stderr)
            raise SystemExit(CANNOT_DROP_OVERRIDE) from None
    from moglm.cli import main

    raise SystemExit(main(sys.argv[1:]))
