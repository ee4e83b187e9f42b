"""The time loop over one layer, written once, with swappable backends.

``run_layer`` is the only place a stack calls to run a cell over a window. Backends:

* ``"reference"``: the plain step loop of :mod:`moglm.recurrence.reference`.
* ``"compiled"``: the fused window in C++ for CPU (:mod:`moglm.recurrence.compiled`), one autograd node
  per layer and window; raises ``ValueError`` where it cannot run.
* ``"fused"``: the fused window in Python, one autograd node per layer and window
  (:mod:`moglm.recurrence.fused_lstm`, :mod:`moglm.recurrence.fused_multiplicative_lstm`), on any device;
  raises ``ValueError`` where it cannot run.
* ``"auto"`` (default): where both can run (CPU, float32/float64, built), the compiled or the fused
  window, whichever :mod:`moglm.recurrence.auto` measured faster on this machine for the layer's shape
  class; else fused; else the reference loop, with a :class:`FusedFallbackWarning` once per reason (see
  :mod:`moglm.recurrence.fallback`).
"""

from __future__ import annotations

from torch import Tensor

from ..cells.base import Cell, Params, State
from ..cells.lstm import LSTMCell
from ..cells.mogrifier import MogrifierLSTMCell
from ..cells.multiplicative_lstm import MultiplicativeLSTMCell
from . import auto
from .compiled import routes
from .compiled.functions import CompiledLSTMFunction, CompiledMultiplicativeLSTMFunction, can_run, run_compiled
from .fallback import FusedFallbackWarning, runtime_reason, warn_once
from .fused_lstm import fused_lstm_layer, layer_spec
from .fused_multiplicative_lstm import fused_multiplicative_lstm_layer
from .reference import reference_layer

BACKENDS = ("auto", "compiled", "fused", "reference")

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


def has_fast_path(cell: Cell) -> bool:
    """Whether a fused or compiled window exists for this cell's kind (its type, a subclass of one, or
    a cell whose :meth:`~moglm.cells.base.Cell.output_adaptation` wraps one); for the others the reference
    loop is their implementation, and running it is no fallback worth a warning."""
    adaptation = cell.output_adaptation()
    inner = cell if adaptation is None else adaptation[0]
    return isinstance(inner, tuple(FUSED)) and not getattr(inner, "reference_only", False)


def unsupported_reason(cell: Cell, params: Params, xs: Tensor, state: State, h_mask: Tensor | None) -> str | None:
    """Why the fused path cannot run this layer now (``None`` if it can)."""
    if type(cell) not in FUSED:
        return f"no fused recurrence for {type(cell).__name__}"
    overridden = [name for name in ("step", "gates", "mogrify", "intermediate") if name in vars(cell)]
    if overridden:
        return f"{type(cell).__name__}.{overridden[0]} was replaced on the instance"
    return runtime_reason([xs, *state, h_mask, *params.values()], h_mask)


#: exact cell type -> compiled autograd Function
COMPILED = {
    LSTMCell: CompiledLSTMFunction,
    MogrifierLSTMCell: CompiledLSTMFunction,
    MultiplicativeLSTMCell: CompiledMultiplicativeLSTMFunction,
}


def _adaptation_fits(matrix: Tensor, xs: Tensor, cell: Cell) -> bool:
    """Whether the compiled window can apply ``matrix``: ``[U, U]`` or ``[B, U, U]`` with U <= the hidden
    size, on ``xs``'s device and dtype. Anything else runs the reference loop, whose error names the shapes."""
    units = matrix.shape[-1] if matrix.dim() in (2, 3) else 0
    return (0 < units <= cell.hidden_size and matrix.shape[-2] == units and matrix.dtype == xs.dtype
            and matrix.device == xs.device and (matrix.dim() == 2 or matrix.shape[0] == xs.shape[1]))


#: how :mod:`.auto` runs each candidate path on its probe window: ``f(cell, params, xs, state)`` (the compiled
#: window also takes ``route=``, its per-step GEMM route)
AUTO_RUNNERS = {
    "compiled": lambda cell, p, xs, state, route=None: run_compiled(COMPILED[type(cell)], layer_spec(cell, p), cell,
                                                                    p, xs, state, None, route=route),
    "fused": lambda cell, p, xs, state: FUSED[type(cell)](cell, p, xs, state, None),
}


def _class_route(cell: Cell, params: Params, xs: Tensor, training: bool):
    """The compiled window's per-step route for this layer's shape class (``routes.class_route``)."""
    return routes.class_route(COMPILED[type(cell)], layer_spec(cell, params), xs, training)


def run_layer(
    cell: Cell, params: Params, xs: Tensor, state: State, h_mask: Tensor | None = None, backend: str = "auto"
) -> tuple[Tensor, State]:
    """Run one layer over a window ``xs`` ``[T, B, m]``; returns ``(outputs [T, B, H], final state)``.

    A cell with an output adaptation (:meth:`~moglm.cells.base.Cell.output_adaptation`, sparse dynamic
    evaluation's wrapper: ``(inner cell, M)``, the first U units of h becoming ``h + M h`` after every step)
    runs the compiled window with that adaptation where the inner cell can, and otherwise the reference loop
    (no Python fused version).

    An empty batch (``B == 0``) that the fused window would run runs the reference loop instead: there is
    nothing to fuse, and its outputs ``[T, 0, H]`` and final state stay on the autograd graph, as
    torch.nn.LSTM's do. A backend that cannot run the cell refuses an empty batch as it refuses any."""
    if backend == "reference" or (backend == "auto" and not has_fast_path(cell)):
        return reference_layer(cell, params, xs, state, h_mask)  # for a GRU, an RNN ... the loop is the path
    adaptation = cell.output_adaptation()
    if adaptation is not None:
        inner, matrix = adaptation
        if (backend != "fused" and type(inner) in COMPILED and _adaptation_fits(matrix, xs, inner)
                and unsupported_reason(inner, params, xs, state, h_mask) is None
                and runtime_reason([matrix], None) is None and can_run(xs) is None):
            return run_compiled(COMPILED[type(inner)], layer_spec(inner, params), inner, params, xs, state, h_mask,
                                adapt=matrix)
        return reference_layer(cell, params, xs, state, h_mask)
    reason = unsupported_reason(cell, params, xs, state, h_mask)
    if reason is None and backend in ("auto", "compiled"):
        why_not = can_run(xs)
        choice = auto.choose(cell, params, xs, AUTO_RUNNERS, _class_route) if (
            why_not is None and backend == "auto" and xs.shape[1] > 0) else {"backend": "compiled"}
        if why_not is None and choice["backend"] == "compiled":
            return run_compiled(COMPILED[type(cell)], layer_spec(cell, params), cell, params, xs, state, h_mask,
                                route=routes.stored_route(choice.get("route")))
        if backend == "compiled":
            raise ValueError(f"backend='compiled' cannot run this layer: {why_not} (use backend='auto' or 'fused')")
    if reason is None:
        return (reference_layer if xs.shape[1] == 0 else FUSED[type(cell)])(cell, params, xs, state, h_mask)
    if backend != "auto":
        raise ValueError(f"backend={backend!r} cannot run this layer: {reason} (use backend='auto' or 'reference')")
    warn_once(reason)
    return reference_layer(cell, params, xs, state, h_mask)


__all__ = ["BACKENDS", "COMPILED", "FUSED", "FusedFallbackWarning", "check_backend", "reference_layer", "run_layer"]
