"""The time loop over one layer, written once, with swappable backends.

``run_layer`` is the only place a stack calls to run a cell over a window. Backends:

* ``"reference"``: the plain step loop of :mod:`moglm.recurrence.reference`.
* ``"fused"``: one custom autograd node per layer and window (:mod:`moglm.recurrence.fused_lstm`,
  :mod:`moglm.recurrence.fused_multiplicative_lstm`); raises ``ValueError`` where it cannot run.
* ``"auto"`` (default): fused where it can run, otherwise the reference loop, with a
  :class:`FusedFallbackWarning` once per reason (see :mod:`moglm.recurrence.fallback`).
"""

from __future__ import annotations

from torch import Tensor

from ..cells.base import Cell, Params, State
from ..cells.lstm import LSTMCell
from ..cells.mogrifier import MogrifierLSTMCell
from ..cells.multiplicative_lstm import MultiplicativeLSTMCell
from .fallback import FusedFallbackWarning, runtime_reason, warn_once
from .fused_lstm import fused_lstm_layer
from .fused_multiplicative_lstm import fused_multiplicative_lstm_layer
from .reference import reference_layer

BACKENDS = ("auto", "fused", "reference")

#: exact cell type -> fused implementation (subclasses may change the step, so they are not matched).
FUSED = {
    LSTMCell: fused_lstm_layer,
    MogrifierLSTMCell: fused_lstm_layer,
    MultiplicativeLSTMCell: fused_multiplicative_lstm_layer,
}


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return backend


def unsupported_reason(cell: Cell, params: Params, xs: Tensor, state: State, h_mask: Tensor | None) -> str | None:
    """Why the fused path cannot run this layer now (``None`` if it can)."""
    if type(cell) not in FUSED:
        return f"no fused recurrence for {type(cell).__name__}"
    overridden = [name for name in ("step", "gates", "mogrify", "intermediate") if name in vars(cell)]
    if overridden:
        return f"{type(cell).__name__}.{overridden[0]} was replaced on the instance"
    return runtime_reason([xs, *state, h_mask, *params.values()], h_mask)


def run_layer(
    cell: Cell, params: Params, xs: Tensor, state: State, h_mask: Tensor | None = None, backend: str = "auto"
) -> tuple[Tensor, State]:
    """Run one layer over a window ``xs`` ``[T, B, m]``; returns ``(outputs [T, B, H], final state)``."""
    if backend == "reference":
        return reference_layer(cell, params, xs, state, h_mask)
    reason = unsupported_reason(cell, params, xs, state, h_mask)
    if reason is None:
        return FUSED[type(cell)](cell, params, xs, state, h_mask)
    if backend == "fused":
        raise ValueError(f"backend='fused' cannot run this layer: {reason} (use backend='auto' or 'reference')")
    warn_once(reason)
    return reference_layer(cell, params, xs, state, h_mask)


__all__ = ["BACKENDS", "FUSED", "FusedFallbackWarning", "check_backend", "reference_layer", "run_layer"]
