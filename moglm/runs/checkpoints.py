"""Checkpoints: tensors in safetensors, everything else in JSON; loading never executes code.

A checkpoint is an immutable directory ``checkpoints/step-00001200/`` holding ``<group>.safetensors``
files (``model``, ``averaged``, ``training``) and ``state.json``. It is written under a temporary name
and renamed into place, then small pointer files (``last.json``, ``best.json``) are replaced
atomically to point at it. A kill at any moment therefore leaves the previous checkpoint valid.
Directories no pointer refers to are removed afterwards.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from ..atomic import atomic_directory, atomic_write_text
from ..errors import MoglmError


def _contiguous(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k: v.detach().contiguous().cpu() for k, v in tensors.items()}


class CheckpointStore:
    """The ``checkpoints/`` folder of a run directory."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def write(self, step: int, groups: dict[str, dict[str, Tensor]], state: dict[str, Any]) -> Path:
        """Write a complete checkpoint for ``step`` and return its directory (not yet pointed at)."""
        self.root.mkdir(parents=True, exist_ok=True)
        taken = {info["dir"] for n in ("last", "best") if (info := self.pointer(n)) is not None}
        name, n = f"step-{step:08d}", 0
        while name in taken:  # never replace a checkpoint a pointer refers to
            n += 1
            name = f"step-{step:08d}-{n}"
        final = self.root / name  # a leftover there was never pointed at: atomic_directory replaces it
        with atomic_directory(final) as tmp:
            for group, tensors in groups.items():
                save_file(_contiguous(tensors), str(tmp / f"{group}.safetensors"))
            (tmp / "state.json").write_text(json.dumps(state, indent=1))
        return final

    def point(self, name: str, directory: Path, **info: Any) -> None:
        """Atomically make pointer ``name`` (``last`` or ``best``) refer to ``directory``."""
        atomic_write_text(self.root / f"{name}.json", json.dumps({"dir": directory.name, **info}, indent=1))

    def pointer(self, name: str) -> dict[str, Any] | None:
        """The pointer's content (with ``path`` resolved), or ``None`` when there is none."""
        p = self.root / f"{name}.json"
        if not p.is_file():
            return None
        try:
            info = json.loads(p.read_text())
        except json.JSONDecodeError:
            raise MoglmError(f"{p}: corrupt checkpoint pointer") from None
        info["path"] = self.root / info["dir"]
        if not info["path"].is_dir():
            raise MoglmError(f"{p}: points at missing checkpoint {info['dir']}")
        return info

    def prune(self) -> None:
        """Remove checkpoint directories (and stale temporaries) no pointer refers to."""
        keep = {info["dir"] for n in ("last", "best") if (info := self.pointer(n)) is not None}
        for d in self.root.iterdir():
            if d.is_dir() and d.name not in keep and (d.name.startswith("step-") or d.name.startswith(".tmp-")):
                shutil.rmtree(d, ignore_errors=True)


def load_group(directory: Path, group: str, device: torch.device | str = "cpu") -> dict[str, Tensor]:
    path = Path(directory) / f"{group}.safetensors"
    if not path.is_file():
        raise MoglmError(f"{path}: missing from the checkpoint")
    return load_file(str(path), device=str(device))


def load_state(directory: Path) -> dict[str, Any]:
    return json.loads((Path(directory) / "state.json").read_text())
