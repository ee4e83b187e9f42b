"""Choosing the device a command runs on, and how many CPU cores it may use."""

from __future__ import annotations

import os

import torch

from .errors import MoglmError


def resolve_device(name: str) -> torch.device:
    """``auto`` is CUDA when available, else CPU; anything else is checked (``cuda`` without CUDA is an
    error of one line, not a crash later)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise MoglmError(f"unknown device {name!r} (use auto, cpu, cuda or cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise MoglmError(f"device {name!r} was asked for but CUDA is not available")
    return device


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity, as ``taskset`` or a container sets it), not the
    machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1
