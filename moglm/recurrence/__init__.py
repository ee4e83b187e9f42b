"""The time loop over one layer, written once, with swappable backends.

``run_layer`` is the only place a stack calls to run a cell over a window. ``backend="reference"``
forces the plain step loop of :mod:`moglm.recurrence.reference`.
"""

from __future__ import annotations

from torch import Tensor

from ..cells.base import Cell, Params, State
from .reference import reference_layer

BACKENDS = ("auto", "reference")


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return backend


def run_layer(
    cell: Cell, params: Params, xs: Tensor, state: State, h_mask: Tensor | None = None, backend: str = "auto"
) -> tuple[Tensor, State]:
    """Run one layer over a window ``xs`` ``[T, B, m]``; returns ``(outputs [T, B, H], final state)``."""
    return reference_layer(cell, params, xs, state, h_mask)


__all__ = ["BACKENDS", "check_backend", "reference_layer", "run_layer"]
