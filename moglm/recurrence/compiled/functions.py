"""The compiled windows' autograd Functions: one node per layer and window, its forward and backward in C++.

What they compute is what :mod:`moglm.recurrence.fused_lstm` and :mod:`.fused_multiplicative_lstm` compute (and
what :mod:`moglm.recurrence.reference`, their reference twin, computes step by step); how the ops run is in the
package docstring. Every product inside the loop takes the route :mod:`.routes` chose.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from ...cells.base import Params
from ..fallback import autocast_dtype, double_backward_by_reference
from . import build, routes

#: a worker thread takes at least this many batch rows; with fewer rows per thread the window runs on
#: one thread and its products use every thread instead (batch 1 sampling, small dynamic evaluation)
MIN_ROWS = 8


def can_run(xs: Tensor) -> str | None:
    """Why the compiled path cannot run on ``xs`` (``None`` if it can)."""
    if xs.device.type != "cpu":
        return f"the compiled recurrence runs on CPU only (input on {xs.device.type})"
    if xs.dtype not in (torch.float32, torch.float64):
        return f"the compiled recurrence takes float32 or float64 (input is {xs.dtype})"
    if autocast_dtype(xs) is not None:
        return "autocast is on (the fused window runs its products in the autocast dtype)"
    if not build.available():
        return f"the compiled recurrence is unavailable ({build.unavailable_reason()})"
    return None


# -- the layers ------------------------------------------------------------------------------------------



def _round_lists(spec, p: Params) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
    """The rounds' parameters as the op takes them: each kind's stacked tensor, x's rounds' (``q``) then h's
    (``r``), of its matrices (full rank) or right factors, its left factors, its biases; round i reads its
    kind's row (``csrc/mogrifier_lstm.cpp``, ``per_round``). No view a round: a one-step window calls this at
    every step."""
    mats, lefts, biases = _round_names(spec.rank > 0, spec.names)
    return [p[name] for name in mats], [p[name] for name in lefts], [p[name] for name in biases]


@functools.lru_cache(maxsize=64)
def _round_names(low_rank: bool, names: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    """:func:`_round_lists`' parameter names for a layer of these parameter ``names`` (kept: a one-step window
    asks at every step)."""
    first = "right" if low_rank else "weight"
    kinds = [kind for kind in ("q", "r") if f"mogrifier_{kind}_{first}" in names]
    mats = tuple(f"mogrifier_{kind}_{first}" for kind in kinds)
    lefts = tuple(f"mogrifier_{kind}_left" for kind in kinds) if low_rank else ()
    biases = tuple(f"mogrifier_{kind}_bias" for kind in kinds if f"mogrifier_{kind}_bias" in names)
    return mats, lefts, biases


def _bias(p: Params) -> Tensor | None:
    return p["bias_ih"] + p["bias_hh"] if "bias_ih" in p else None


class _CompiledFunction(torch.autograd.Function):
    """Autograd over a whole window: ``apply(spec, cell, xs, h0, c0, mask, adapt, *params) -> (ys, h_T, c_T)``;
    ``adapt`` is sparse dynamic evaluation's matrix M (or ``None``). Subclasses define ``run_forward`` and
    ``run_backward`` (the ops' calls)."""

    @classmethod
    def forward(cls, ctx, spec, cell, xs, h0, c0, mask, adapt, *params):
        p = dict(zip(spec.names, params))
        out = cls.run_forward(spec, xs, h0, c0, mask, p, save=True, adapt=adapt)
        ctx.spec, ctx.cell, ctx.route = spec, cell, routes.step_route(xs.dtype)  # the backward's products take it too
        ctx.save_for_backward(xs, h0, c0, mask, adapt, *params, out[0], *out[3:])
        return out[0], out[1], out[2]

    @classmethod
    def backward(cls, ctx, dys, dh_T, dc_T):
        spec = ctx.spec
        tensors = ctx.saved_tensors
        k = 5 + len(spec.names)
        needs = ctx.needs_input_grad[2:]
        xs, h0, c0, mask, adapt = tensors[:5]
        if torch.is_grad_enabled():  # create_graph=True: differentiate the reference loop instead
            if adapt is not None:
                raise RuntimeError("double backward through sparse dynamic evaluation's adaptation is not supported "
                                   "by the compiled recurrence; use backend='reference'")
            inputs = (xs, h0, c0, mask, *tensors[5:k])
            grads = double_backward_by_reference(ctx.cell, spec.names, needs[:4] + needs[5:], inputs,
                                                 (dys, dh_T, dc_T))
            return (None, None, *grads[:4], None, *grads[4:])
        p = dict(zip(spec.names, tensors[5:k]))
        with routes.using_route(ctx.route):
            grads = cls.run_backward(spec, xs, h0, c0, mask, p, list(tensors[k:]), (dys, dh_T, dc_T),
                                     bool(needs[0]), any(needs[5:]), adapt)
        out = [grads["x"], grads["h0"], grads["c0"], None, grads.get("adapt"), *(grads.get(name) for name in spec.names)]
        return (None, None, *(g if need else None for g, need in zip(out, needs)))


class CompiledLSTMFunction(_CompiledFunction):
    """The LSTM (rounds = 0) and the Mogrifier LSTM (``csrc/mogrifier_lstm.cpp``)."""

    #: the window can split its gate products by columns (``+columns`` routes)
    column_split = True

    @staticmethod
    def step_products(spec, training: bool) -> list[tuple[int, int, int]]:
        """``(K, N, count)`` of the products a step runs forward: the gate product's two halves (the LSTM in
        training multiplies ``W_ih x`` for all rows before the loop) and each round's one or two."""
        m, n = spec.input_size, spec.hidden_size
        gates = [(n, 4 * n, 1)] if spec.rounds == 0 and training else [(m, 4 * n, 1), (n, 4 * n, 1)]
        return gates + CompiledLSTMFunction.round_products(spec)

    @staticmethod
    def round_products(spec) -> list[tuple[int, int, int]]:
        """The rounds' ``(K, N, count)`` among :meth:`step_products` (the last ones), which may take a route of
        their own."""
        m, n, k = spec.input_size, spec.hidden_size, spec.rank
        out = []
        for i in range(1, spec.rounds + 1):
            src, dst = (n, m) if i % 2 == 1 else (m, n)  # odd rounds gate x from h, even ones h from x
            out += [(src, k, 1), (k, dst, 1)] if k > 0 else [(src, dst, 1)]
        return out

    @staticmethod
    def run_forward(spec, xs, h0, c0, mask, p: Params, save: bool, adapt: Tensor | None = None) -> list[Tensor]:
        mats, lefts, biases = _round_lists(spec, p)
        return torch.ops.moglm.mogrifier_lstm_forward(
            xs, h0, c0, mask, p["weight_ih"], p["weight_hh"], _bias(p), mats, lefts, biases, spec.rounds,
            spec.rank, spec.zigzag, spec.capped, save, routes.step_route(xs.dtype), MIN_ROWS, adapt,
        )

    @staticmethod
    def run_backward(spec, xs, h0, c0, mask, p: Params, saved, grads_out, need_dx: bool, need_weights: bool,
                     adapt: Tensor | None = None) -> dict:
        mats, lefts, biases = _round_lists(spec, p)
        g = torch.ops.moglm.mogrifier_lstm_backward(
            xs, h0, c0, mask, p["weight_ih"], p["weight_hh"], "bias_ih" in p, mats, lefts, biases, spec.rounds,
            spec.rank, spec.zigzag, spec.capped, saved, *grads_out, need_dx, need_weights, routes.step_route(xs.dtype),
            MIN_ROWS, adapt, routes.weight_gradient_route(xs.dtype),
        )
        out = {"x": g[0], "h0": g[1], "c0": g[2], "weight_ih": g[3], "weight_hh": g[4], "adapt": g[-1]}
        if "bias_ih" in p:
            out["bias_ih"] = out["bias_hh"] = g[5]
        if need_weights and spec.rounds:
            per_round = [g[6 + 3 * i : 9 + 3 * i] for i in range(spec.rounds)]  # (mat or right, left, bias)
            for kind, first in (("q", 0), ("r", 1)):
                rounds = per_round[first::2]
                if not rounds:
                    continue
                prefix = f"mogrifier_{kind}_"
                if spec.rank > 0:
                    out[prefix + "right"] = torch.stack([r[0] for r in rounds])
                    out[prefix + "left"] = torch.stack([r[1] for r in rounds])
                else:
                    out[prefix + "weight"] = torch.stack([r[0] for r in rounds])
                if prefix + "bias" in p:
                    out[prefix + "bias"] = torch.stack([r[2] for r in rounds])
        return out


class CompiledMultiplicativeLSTMFunction(_CompiledFunction):
    """Krause's multiplicative LSTM (``csrc/multiplicative_lstm.cpp``)."""

    #: the window can split both its per-step products by columns (``+columns`` routes)
    column_split = True

    @staticmethod
    def step_products(spec, training: bool) -> list[tuple[int, int, int]]:
        """``(K, N, count)`` of a step's products: ``W_mh h`` and ``W_hh m`` (the x parts run before the loop)."""
        n = spec.hidden_size
        return [(n, n, 1), (n, 4 * n, 1)]

    @staticmethod
    def run_forward(spec, xs, h0, c0, mask, p: Params, save: bool, adapt: Tensor | None = None) -> list[Tensor]:
        return torch.ops.moglm.multiplicative_lstm_forward(
            xs, h0, c0, mask, p["weight_ih"], p["weight_hh"], _bias(p), p["weight_mx"], p["weight_mh"], spec.capped,
            save, routes.step_route(xs.dtype), MIN_ROWS, adapt,
        )

    @staticmethod
    def run_backward(spec, xs, h0, c0, mask, p: Params, saved, grads_out, need_dx: bool, need_weights: bool,
                     adapt: Tensor | None = None) -> dict:
        g = torch.ops.moglm.multiplicative_lstm_backward(
            xs, h0, c0, mask, p["weight_ih"], p["weight_hh"], "bias_ih" in p, p["weight_mx"], p["weight_mh"],
            spec.capped, saved, *grads_out, need_dx, need_weights, routes.step_route(xs.dtype), MIN_ROWS, adapt,
            routes.weight_gradient_route(xs.dtype),
        )
        out = {"x": g[0], "h0": g[1], "c0": g[2], "weight_ih": g[3], "weight_hh": g[4], "weight_mx": g[6],
               "weight_mh": g[7], "adapt": g[8]}
        if "bias_ih" in p:
            out["bias_ih"] = out["bias_hh"] = g[5]
        return out


def run_compiled(function, spec, cell, params: Params, xs: Tensor, state, h_mask: Tensor | None,
                 adapt: Tensor | None = None, route: int | None = None):
    """Run ``function`` over ``xs`` ``[T, B, m]``; ``(ys, (h_T, c_T))``. ``adapt``: sparse dynamic
    evaluation's M (``[U, U]`` or ``[B, U, U]``), applied to the first U units of h after every step.
    ``route``: the per-step products' route (``None``: the machine's, :func:`.routes.gemm_route`). Without
    anything to differentiate, only the forward runs, saving nothing."""
    with routes.using_route(route):
        return _run_compiled(function, spec, cell, params, xs, state, h_mask, adapt)


def _run_compiled(function, spec, cell, params: Params, xs: Tensor, state, h_mask: Tensor | None,
                  adapt: Tensor | None):
    xs = xs.contiguous()
    h0, c0 = (s.contiguous() for s in state)
    values = tuple(params.values())
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (xs, h0, c0, adapt, *values)):
        ys, h_T, c_T = function.apply(spec, cell, xs, h0, c0, h_mask, adapt, *values)
    else:
        ys, h_T, c_T = function.run_forward(spec, xs, h0, c0, h_mask, params, save=False, adapt=adapt)[:3]
    return ys, (h_T, c_T)
