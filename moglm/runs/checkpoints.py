"""Checkpoints: tensors in safetensors, everything else in JSON; loading never executes code.

A checkpoint is an immutable directory ``checkpoints/step-00001200/`` holding ``<group>.safetensors``
files (``model``, ``averaged``, ``training``), ``state.json`` and ``manifest.json`` (the SHA-256 of every
other file). It is written under a temporary name and renamed into place, then small pointer files
(``last.json``, ``best.json``) are replaced atomically to point at it; the checkpoint ``last`` pointed at
before stays as ``previous.json`` until a newer one has been written. A kill at any moment therefore
leaves a valid checkpoint, and a checkpoint damaged later (a truncated file, flipped bits, a broken
pointer) is detected by :meth:`CheckpointStore.open`, which falls back to ``previous`` with a message.
Directories no pointer refers to, and temporaries a kill left behind, are removed afterwards.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from ..atomic import atomic_directory, atomic_write_text
from ..errors import MoglmError

POINTERS = ("last", "best", "previous")


class CorruptCheckpoint(MoglmError):
    """A checkpoint or pointer that cannot be read or does not match its manifest."""


def _contiguous(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k: v.detach().contiguous().cpu() for k, v in tensors.items()}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class CheckpointStore:
    """The ``checkpoints/`` folder of a run directory."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    # -- writing -------------------------------------------------------------------------------------
    def write(self, step: int, groups: dict[str, dict[str, Tensor]], state: dict[str, Any]) -> Path:
        """Write a complete checkpoint for ``step`` and return its directory (not yet pointed at)."""
        self.root.mkdir(parents=True, exist_ok=True)
        taken = self._referenced()
        name, n = f"step-{step:08d}", 0
        while name in taken:  # never replace a checkpoint a pointer refers to
            n += 1
            name = f"step-{step:08d}-{n}"
        final = self.root / name  # a leftover there was never pointed at: atomic_directory replaces it
        with atomic_directory(final) as tmp:
            for group, tensors in groups.items():
                save_file(_contiguous(tensors), str(tmp / f"{group}.safetensors"))
            (tmp / "state.json").write_text(json.dumps(state, indent=1))
            manifest = {f.name: _sha256(f) for f in sorted(tmp.iterdir())}
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
        return final

    def point(self, name: str, directory: Path, **info: Any) -> None:
        """Atomically make pointer ``name`` refer to ``directory``; moving ``last`` keeps the checkpoint it
        pointed at as ``previous`` (the fallback if the new one is ever found damaged)."""
        if name == "last":
            old = self._read_pointer("last")
            if old is not None and old.get("dir") != directory.name and (self.root / str(old.get("dir"))).is_dir():
                atomic_write_text(self.root / "previous.json", json.dumps(old, indent=1))
        atomic_write_text(self.root / f"{name}.json", json.dumps({"dir": directory.name, **info}, indent=1))

    # -- reading -------------------------------------------------------------------------------------
    def _read_pointer(self, name: str) -> dict[str, Any] | None:
        p = self.root / f"{name}.json"
        if not p.is_file():
            return None
        shape = "corrupt checkpoint pointer (expected an object with dir and step)"
        info = json_object(p, "corrupt checkpoint pointer (not JSON)", shape)
        if not isinstance(info.get("dir"), str) or not isinstance(info.get("step"), int):
            raise CorruptCheckpoint(f"{p}: {shape}")
        return info

    def pointer(self, name: str) -> dict[str, Any] | None:
        """The pointer's content (with ``path`` resolved), or ``None`` when there is none; a pointer that
        is not valid JSON of the right shape, or points at a missing folder, is a :class:`CorruptCheckpoint`."""
        info = self._read_pointer(name)
        if info is None:
            return None
        info["path"] = self.root / info["dir"]
        if not info["path"].is_dir():
            raise CorruptCheckpoint(f"{self.root / (name + '.json')}: points at missing checkpoint {info['dir']}")
        return info

    def verify(self, directory: Path) -> None:
        """Check every file of a checkpoint against its manifest (a :class:`CorruptCheckpoint` if not)."""
        manifest = json_object(directory / "manifest.json", "missing or unreadable checkpoint manifest",
                                "not a checkpoint manifest")
        for name, digest in manifest.items():
            path = directory / str(name)
            if not path.is_file():
                raise CorruptCheckpoint(f"{path}: missing from the checkpoint")
            if _sha256(path) != digest:
                raise CorruptCheckpoint(f"{path}: damaged (its checksum does not match the checkpoint's manifest)")

    def open(self, name: str, log: Callable[[str], None] | None = None) -> dict[str, Any] | None:
        """The verified checkpoint ``name`` points at (its pointer, with ``path``), or ``None`` when there is
        none. A damaged ``last`` falls back to ``previous``, saying so through ``log``; a damaged checkpoint
        with no fallback is a one-line :class:`CorruptCheckpoint`."""
        try:
            info = self.pointer(name)
            if info is not None:
                self.verify(info["path"])
            return info
        except CorruptCheckpoint as e:
            if name != "last":
                raise
            fallback = self.open("previous")
            if fallback is None:
                raise CorruptCheckpoint(f"{e}; there is no earlier checkpoint to fall back to") from None
            if log is not None:
                log(f"{e}; falling back to the previous checkpoint (step {fallback['step']})")
            atomic_write_text(self.root / "last.json", json.dumps({k: v for k, v in fallback.items() if k != "path"},
                                                                  indent=1))
            return fallback

    def _referenced(self) -> set[str]:
        names = set()
        for n in POINTERS:
            try:
                info = self._read_pointer(n)
            except CorruptCheckpoint:
                continue
            if info is not None:
                names.add(info["dir"])
        return names

    def prune(self) -> None:
        """Remove checkpoint directories no pointer refers to, and temporaries (``.tmp-*`` folders, hidden
        pointer files) a kill left behind. Only the process holding the run's lock calls it."""
        keep = self._referenced()
        for d in self.root.iterdir():
            if d.is_dir() and d.name not in keep and (d.name.startswith("step-") or d.name.startswith(".tmp-")):
                shutil.rmtree(d, ignore_errors=True)
            elif d.is_file() and d.name.startswith(".") and d.name.endswith(".tmp.json"):
                d.unlink(missing_ok=True)


def load_group(directory: Path, group: str, device: torch.device | str = "cpu") -> dict[str, Tensor]:
    """The tensors of one group of a checkpoint (safetensors: loading never executes code)."""
    path = Path(directory) / f"{group}.safetensors"
    if not path.is_file():
        raise CorruptCheckpoint(f"{path}: missing from the checkpoint")
    try:
        return load_file(str(path), device=str(device))
    except (SafetensorError, OSError, ValueError) as e:
        raise CorruptCheckpoint(f"{path}: unreadable ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None


def load_state(directory: Path) -> dict[str, Any]:
    """A checkpoint's ``state.json``."""
    return json_object(Path(directory) / "state.json", "missing or unreadable", "not a checkpoint state")


def json_object(path: Path, unreadable: str, not_an_object: str,
                error: type[MoglmError] = CorruptCheckpoint) -> dict[str, Any]:
    """The JSON object in one of a run's files (a checkpoint's, by default); an ``error`` naming ``path`` if it
    is missing, not JSON, or not an object."""
    try:
        value = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        raise error(f"{path}: {unreadable}") from None
    if not isinstance(value, dict):
        raise error(f"{path}: {not_an_object}")
    return value
