"""Fused LSTM and Mogrifier LSTM recurrence: one autograd node per layer and window.

Equations (docs/method.md, "The Mogrifier step" and "The LSTM cell"; Melis et al. 2020, eq. 1-2)::

    h~  = h_{t-1} * mask                                   variational state dropout (mask optional)
    odd i:   x^i = 2 sigmoid(Q_i h + a_i) * x^{i-2}         even i:  h^i = 2 sigmoid(R_i x + b_i) * h^{i-2}
    [i, f, j, o] = [x_up; h_up] @ [W_ih; W_hh]^T + b_ih + b_hh
    c_t = f * c_{t-1} + i * j  (or min(1 - f, i) * j),     h_t = o * tanh(c_t)

How the work is arranged (docs/fused-recurrence.md has the measurements behind each choice):

* The chains are stored divided by two per gate applied (``x^ = x / 2^(gates so far)``), so a round is
  one ``sigmoid`` and one ``mul``; the powers of two (exact in floating point) are folded once per call into
  the matrices that read the chains (the round matrices and the columns of W_ih / W_hh).
* Forward, per step: the rounds and one ``[x_up; h_up] @ W`` product. With ``rounds == 0`` the input
  projection is computed for many steps at once and a step only adds ``h~ @ W_hh^T``.
* Backward, per step: data gradients only. Every weight gradient is one product over all T*B rows after
  the loop, from the buffers the forward filled.
* Saved: gate activations ``[T, B, 4n]``, c ``[T, B, n]``, ``[x_up; h_up]`` ``[T, B, m+n]``, per round its
  gate ``[T, B, out]``, its intermediate x or h, and (low rank) ``src @ right^T`` ``[T, B, k]``; linear in T.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..cells.base import Params
from . import cuda_graphs
from .fallback import autocast_dtype, double_backward_by_reference
from .fused_cell import (
    BackwardScratch,
    flatten_saved,
    gate_permutation,
    h_prev_all,
    lstm_weights,
    per_step,
    unflatten_saved,
)
from .gemm import CHUNK_ROWS, Linear, low_precision_products, matmul_tn, product_dtype
from .triton_pointwise import pointwise_for
from .triton_rounds import TritonRounds, rounds_for
from .triton_step_rounds import StepChains, TritonStepRounds, step_rounds_for, step_weights


class LayerSpec(NamedTuple):
    """Static description of one layer for the fused paths (a named tuple: a one-token step makes one at every
    layer and step, and a frozen dataclass took three times as long)."""

    input_size: int
    hidden_size: int
    rounds: int
    rank: int  # 0: full rank
    zigzag: bool
    capped: bool
    names: tuple[str, ...]  # parameter names, in the order they are passed to the autograd Function


def layer_spec(cell, params: Params) -> LayerSpec:
    rounds, rank, zigzag = getattr(cell, "rounds", 0), getattr(cell, "rank", 0), getattr(cell, "zigzag", True)
    return LayerSpec(cell.input_size, cell.hidden_size, rounds, rank, zigzag, cell.capped_input_gate, tuple(params))


class _Round:
    """Mogrifier round ``i``: gates chain ``target`` (x for odd i, h for even i) from index ``j`` to ``j+1``,
    reading chain ``source`` at ``src_j`` (stored divided by ``scale``)."""

    def __init__(self, spec: LayerSpec, p: Params, i: int) -> None:
        kind, self.j = ("q", (i - 1) // 2) if i % 2 == 1 else ("r", i // 2 - 1)
        self.kind = kind
        self.target, self.source = ("x", "h") if kind == "q" else ("h", "x")
        self.src_j = (self.j if kind == "q" else self.j + 1) if spec.zigzag else 0
        self.scale = float(2**self.src_j)
        prefix = f"mogrifier_{kind}_"
        self.bias = p[prefix + "bias"][self.j] if prefix + "bias" in p else None  # [out]
        self.low_rank = spec.rank > 0
        if self.low_rank:
            self.left, self.right = p[prefix + "left"][self.j], p[prefix + "right"][self.j]  # [out, k], [k, in]
        else:
            self.full = p[prefix + "weight"][self.j]  # [out, in]

    def weights(self) -> tuple[Tensor, Tensor]:
        """``(2^j Q_right [k, in], Q_left [out, k])``: the low-rank factors as the round kernels take them."""
        return (self.scale * self.right).contiguous(), self.left

    def forward_ops(self, rows: int) -> None:
        if self.low_rank:
            self.low = Linear(self.scale * self.right, None, rows)  # src^ -> low [B, k]
            self.pre = Linear(self.left, self.bias, rows)  # low -> p [B, out]
        else:
            self.pre = Linear(self.scale * self.full, self.bias, rows)  # src^ -> p

    def backward_ops(self, rows: int) -> None:
        if self.low_rank:
            self.d_low = Linear(self.left.t(), None, rows)  # dp -> dlow
            self.d_src = Linear((self.scale * self.right).t(), None, rows)  # dlow -> d src^
        else:
            self.d_src = Linear((self.scale * self.full).t(), None, rows)  # dp -> d src^


def _chains(xs_t, h_first_t, xc, hc, xh, m: int, nr: int, views) -> dict[str, list[list[Tensor]]]:
    """Per-step views of the stored chains: ``chains[name][j][t]`` is x^j / h^j (divided by 2^j) at step t."""
    x = [xs_t, *(views(b) for b in xc), views(xh[:, :, :m])]
    h = [h_first_t, *(views(b) for b in hc), views(xh[:, :, m:])] if nr else [h_first_t]
    return {"x": x, "h": h}


def _per_round(sgx: Tensor, sgh: Tensor, r: int) -> list[Tensor]:
    """Per-round buffers stacked per chain (``[nq, ...]`` for the x rounds, ``[nr, ...]`` for the h rounds)
    as one list in round order."""
    return [sgx[(i - 1) // 2] if i % 2 else sgh[i // 2 - 1] for i in range(1, r + 1)]


def _unstack(stacked: dict[str, Tensor], r: int) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
    """The stacked chain buffers as per-index lists: ``(xc, hc, per-round gates in round order)``."""
    return list(stacked["xc"]), list(stacked["hc"]), _per_round(stacked["sgx"], stacked["sgh"], r)


def _step_chains(stacked: dict[str, Tensor], slot: int, x0: Tensor, h0: Tensor, xh: Tensor) -> StepChains:
    """Step ``slot``'s view of the stacked chain buffers, for the step-round kernels."""
    return StepChains(x0, h0, stacked["xc"][:, slot], stacked["hc"][:, slot], xh, stacked["sgx"][:, slot],
                      stacked["sgh"][:, slot])


def fused_forward(spec: LayerSpec, xs: Tensor, h0: Tensor, c0: Tensor, mask: Tensor | None, p: Params, save: bool):
    """Run the window. Returns ``(ys [T, B, n], h_T, c_T, saved)``; ``saved`` (the buffers backward needs)
    is ``None`` unless ``save``. Without ``save`` the per-step buffers are reused."""
    T, B, m = xs.shape
    n, r = spec.hidden_size, spec.rounds
    nq, nr = (r + 1) // 2, r // 2
    w_ih, w_hh, bias = lstm_weights(p, n, xs.device, forward=True)
    pointwise = pointwise_for(xs)  # torch ops, or one Triton kernel each on CUDA
    S = T if save else 1  # leading size of the per-step buffers

    def views(buf: Tensor) -> list[Tensor]:
        return per_step(buf, T, save)

    ys = xs.new_empty(T, B, n)  # [T, B, n]
    cs = xs.new_empty(T if save else 2, B, n)  # [T, B, n]
    tc = xs.new_empty(B, n)  # scratch
    hm = xs.new_empty(S, B, n) if mask is not None and r != 1 else None  # h~ [S, B, n]
    acts: list[Tensor] = []  # gate activations, T x [B, 4n]
    saved: dict = {"acts": acts, "cs": cs, "hm": hm}
    ys_t = ys.unbind(0)
    cs_t = cs.unbind(0) if save else [cs[t % 2] for t in range(T)]
    h_prev_t = [h0, *ys_t[:-1]]
    c_prev_t = [c0, *cs_t[:-1]] if save else [c0, *(cs[(t - 1) % 2] for t in range(1, T))]
    xs_t = xs.unbind(0)
    if r == 0:
        gates_x = Linear(w_ih, bias, CHUNK_ROWS)  # x -> x W_ih^T + b, many steps at once
        gates_h = Linear(w_hh, None, B)
        chunk = max(1, CHUNK_ROWS // B) if gates_x.onednn else T
        hm_t = views(hm) if mask is not None else h_prev_t
        for t in range(T):
            if t % chunk == 0:
                steps = min(chunk, T - t)
                xp_t = gates_x(xs[t : t + steps].reshape(steps * B, m)).view(steps, B, 4 * n).unbind(0)
            if mask is not None:
                torch.mul(h_prev_t[t], mask, out=hm_t[t])  # h~ [B, n]
            g = gates_h(hm_t[t], add=xp_t[t % chunk])  # [B, 4n]
            pointwise.cell_forward(g, c_prev_t[t], cs_t[t], ys_t[t], tc, spec.capped)
            if save:
                acts.append(g)
        return ys, ys[-1].clone(), cs_t[-1].clone(), saved if save else None

    rounds = [_Round(spec, p, i) for i in range(1, r + 1)]
    for rd in rounds:
        rd.forward_ops(B)
    gates = Linear(torch.cat([w_ih * 2.0**nq, w_hh * 2.0**nr], 1), bias, B)  # [x^_up; h^_up] -> gates
    xh = xs.new_empty(S, B, m + n)  # [x^_up; h^_up] [S, B, m+n]
    stacked = {"xc": xs.new_empty(nq - 1, S, B, m),  # x^1 .. x^{nq-1}
               "hc": xs.new_empty(max(nr - 1, 0), S, B, n),  # h^1 .. h^{nr-1}
               "sgx": xs.new_empty(nq, S, B, m), "sgh": xs.new_empty(nr, S, B, n)}  # sigmoid(p) per round
    xc, hc, sgs = _unstack(stacked, r)
    step = step_rounds_for(xs, spec)  # all rounds of a step in one kernel (GPU), or None
    lows: list[list[Tensor]] | Tensor = [[] for _ in rounds]  # low rank: T x [B, k] per round
    if step is not None:
        lows = xs.new_empty(r, T, B, spec.rank) if save else None  # [r, T, B, k]
        weights = step_weights(p, m, n, spec.zigzag)
    saved.update(xh=xh, lows=lows, **stacked)
    h_first_t = views(xh[:, :, m:]) if nr == 0 else (views(hm) if mask is not None else h_prev_t)
    chains = _chains(xs_t, h_first_t, xc, hc, xh, m, nr, views)
    plan = [  # per round: old, new, source, gate (per-step views), GEMMs, where its lows go
        (chains[rd.target][rd.j], chains[rd.target][rd.j + 1], chains[rd.source][rd.src_j], views(sg),
         getattr(rd, "low", None), rd.pre, lows[k] if save and rd.low_rank else None)
        for k, (rd, sg) in enumerate(zip(rounds, sgs))
    ]
    xh_t = views(xh)
    fused_rounds = spec.rank > 0 and rounds_for(xs) is TritonRounds  # each round one kernel (GPU)
    factors = [(*rd.weights(), rd.bias) for rd in rounds] if fused_rounds else None  # (right, left, bias)
    for t in range(T):
        if nr == 0:  # h~ is h_up itself
            torch.mul(h_prev_t[t], mask, out=h_first_t[t]) if mask is not None else h_first_t[t].copy_(h_prev_t[t])
        elif mask is not None:
            torch.mul(h_prev_t[t], mask, out=h_first_t[t])  # h~ [B, n]
        if step is not None:
            slot = t if save else 0
            step.forward(weights, _step_chains(stacked, slot, xs_t[t], h_first_t[t], xh_t[t]),
                         lows[:, t] if save else None)
            plan_now = ()
        else:
            plan_now = plan
        for k, (old, new, src, sg, low_op, pre_op, low_list) in enumerate(plan_now):
            if fused_rounds:
                low = TritonRounds.forward(src[t], *factors[k], old[t], sg[t], new[t])  # [B, k]
                if low_list is not None:
                    low_list.append(low)
                continue
            if low_op is not None:
                low = low_op(src[t])  # [B, k]
                if low_list is not None:
                    low_list.append(low)
                pre = pre_op(low)  # [B, out]
            else:
                pre = pre_op(src[t])  # [B, out]
            pointwise.round_forward(pre, old[t], sg[t], new[t])  # next^ = sigmoid(p) * old^
        g = gates(xh_t[t])  # [B, 4n]
        pointwise.cell_forward(g, c_prev_t[t], cs_t[t], ys_t[t], tc, spec.capped)
        if save:
            acts.append(g)
    return ys, ys[-1].clone(), cs_t[-1].clone(), saved if save else None


def fused_backward(spec: LayerSpec, needs, xs, h0, c0, mask, p: Params, ys, saved, dys, dh_T, dc_T) -> tuple:
    """Gradients for ``(xs, h0, c0, mask, *params)`` (``None`` where ``needs`` is False)."""
    T, B, m = xs.shape
    n, r = spec.hidden_size, spec.rounds
    nq, nr = (r + 1) // 2, r // 2
    w_ih, w_hh, _ = lstm_weights(p, n, xs.device, forward=False)
    pointwise = pointwise_for(xs)
    acts, cs, hm = saved["acts"], saved["cs"], saved["hm"]
    dG = xs.new_empty(T, B, 4 * n)  # gate pre-activation gradients [T, B, 4n]
    dg_ifo_t, dg_j_t = dG[:, :, : 3 * n].unbind(0), dG[:, :, 3 * n :].unbind(0)
    da = BackwardScratch(xs, B, n)
    cs_t, dys_t = cs.unbind(0), dys.unbind(0)
    c_prev_t = [c0, *cs_t[:-1]]
    dh_next, dc_next = dh_T, dc_T
    if r == 0:
        d_h = Linear(w_hh.t(), None, B)  # dG -> dh~
        dG_t = dG.unbind(0)
        for t in range(T - 1, -1, -1):
            dh = dys_t[t] + dh_next
            dc_next = pointwise.cell_backward(dh, dc_next, acts[t], c_prev_t[t], cs_t[t], da, dg_ifo_t[t], dg_j_t[t],
                                              spec.capped)
            dh_next = d_h(dG_t[t])  # dL/dh~ [B, n]
            if mask is not None:
                dh_next.mul_(mask)
        dG2 = dG.view(T * B, 4 * n)
        dx = Linear(w_ih.t(), None, CHUNK_ROWS).rows(dG2).view(T, B, m) if needs[0] else None
        grads = {}
        if any(needs[4:]):
            hh = hm if mask is not None else h_prev_all(h0, ys)  # h~ for every step [T, B, n]
            grads["weight_ih"], grads["weight_hh"] = matmul_tn(dG2, xs.reshape(T * B, m), hh.reshape(T * B, n))
        return _finish(spec, needs, p, dx, dh_next, dc_next, dG2, grads)

    xh, lows = saved["xh"], saved["lows"]
    stacked = {name: saved[name] for name in ("xc", "hc", "sgx", "sgh")}
    xc, hc, sgs = _unstack(stacked, r)
    rounds = [_Round(spec, p, i) for i in range(1, r + 1)]
    for rd in rounds:
        rd.backward_ops(B)
    d_xh = Linear(torch.cat([w_ih * 2.0**nq, w_hh * 2.0**nr], 1).t(), None, B)  # dG -> [dx^_up; dh^_up]
    dx_all = xs.new_empty(T, B, m) if needs[0] else None
    dx_t = dx_all.unbind(0) if dx_all is not None else None
    step = TritonStepRounds if isinstance(lows, Tensor) else None  # as the forward ran (lows stacked)
    if step is not None:  # dL/dp per round, stacked per chain as the kernel writes them
        d_stacked = {"sgx": torch.empty_like(stacked["sgx"]), "sgh": torch.empty_like(stacked["sgh"])}
        dps = _per_round(d_stacked["sgx"], d_stacked["sgh"], r)  # [T, B, out] each
        dlows = xs.new_empty(r, T, B, spec.rank)  # [r, T, B, k]
        weights = step_weights(p, m, n, spec.zigzag)
        dh_step = xs.new_empty(B, n)  # dL/dh~ of the step (consumed before the next one)
        dx_scratch = xs.new_empty(B, m) if dx_t is None else None
        step_mask = mask.contiguous() if mask is not None else None
    else:
        dps = [torch.empty_like(sg) for sg in sgs]  # dL/dp per round, [T, B, out]
        dlows = [[None] * T for _ in rounds]  # low rank: dL/d(low) per round and step

    def views(buf: Tensor) -> list[Tensor]:
        return list(buf.unbind(0))

    h_first_t = views(xh[:, :, m:]) if nr == 0 else (views(hm) if mask is not None else [h0, *ys.unbind(0)[:-1]])
    xs_t = xs.unbind(0)
    chains = _chains(xs_t, h_first_t, xc, hc, xh, m, nr, views)
    plan = [  # per round, in reverse: old value, gate, dp (per-step views), GEMMs, where its dlows go
        (k, rd.target, rd.source, chains[rd.target][rd.j], views(sgs[k]), views(dps[k]), getattr(rd, "d_low", None),
         rd.d_src, dlows[k])
        for k, rd in reversed(list(enumerate(rounds)))
    ]
    dG_t = dG.unbind(0)
    zigzag = spec.zigzag
    fused_rounds = spec.rank > 0 and rounds_for(xs) is TritonRounds  # each round one kernel (GPU)
    factors = {k: rd.weights() for k, rd in enumerate(rounds)} if fused_rounds else None
    for t in range(T - 1, -1, -1):
        dh = dys_t[t] + dh_next
        dc_next = pointwise.cell_backward(dh, dc_next, acts[t], c_prev_t[t], cs_t[t], da, dg_ifo_t[t], dg_j_t[t],
                                          spec.capped)
        dxh = d_xh(dG_t[t])  # [B, m+n]
        if step is not None:  # every round of the step in one kernel, which writes dL/dx^0 and dL/dh~
            step.backward(weights, _step_chains(stacked, t, xs_t[t], h_first_t[t], xh[t]), dxh,
                          d_stacked["sgx"][:, t], d_stacked["sgh"][:, t], dlows[:, t],
                          dx_t[t] if dx_t is not None else dx_scratch, dh_step, step_mask)
            dh_next = dh_step
            continue
        grad = {"x": dxh[:, :m], "h": dxh[:, m:]}  # gradient of each chain's current end
        extra = {"x": None, "h": None}  # no zigzag: gradient reaching x^0 / h^0 as round sources
        for k, target, source, old, sg, dp_t, d_low, d_src, dlow_list in plan:
            if fused_rounds:
                into = grad if zigzag else extra
                right, left = factors[k]
                grad[target], dlow_list[t], into[source] = TritonRounds.backward(
                    grad[target], old[t], sg[t], dp_t[t], left, right, into[source])
                continue
            grad[target] = pointwise.round_backward(grad[target], old[t], sg[t], dp_t[t])  # of the old value
            dp = dp_t[t]  # dL/dp [B, out]
            if d_low is not None:
                dlow_list[t] = dp = d_low(dp)  # [B, k]
            if zigzag:
                grad[source] = d_src(dp, add=grad[source])
            else:
                extra[source] = d_src(dp, add=extra[source])
        for name in ("x", "h"):
            if extra[name] is not None:
                grad[name] = grad[name] + extra[name]
        if dx_t is not None:
            dx_t[t].copy_(grad["x"])
        dh_next = grad["h"] if mask is None else grad["h"] * mask
    dG2 = dG.view(T * B, 4 * n)
    grads = {}
    if any(needs[4:]):
        w = matmul_tn(dG2, xh.view(T * B, m + n))  # [4n, m+n]
        grads["weight_ih"], grads["weight_hh"] = w[:, :m] * 2.0**nq, w[:, m:] * 2.0**nr
        h_first = xh[:, :, m:] if nr == 0 else (hm if mask is not None else h_prev_all(h0, ys))
        chain = {"x": [xs, *xc, xh[:, :, :m]], "h": [h_first, *hc, xh[:, :, m:]]}
        per_round = {}
        for k, rd in enumerate(rounds):
            src = chain[rd.source][rd.src_j].reshape(T * B, -1)  # [TB, in]
            dp = dps[k].view(T * B, -1)  # [TB, out]
            g = {"bias": dp.sum(0)}
            if rd.low_rank:
                low = lows[k] if isinstance(lows, Tensor) else torch.stack(lows[k])  # [T, B, k]
                dlow = dlows[k] if isinstance(dlows, Tensor) else torch.stack(dlows[k])  # [T, B, k]
                g["left"] = matmul_tn(dp, low.view(T * B, -1))  # [out, k]
                g["right"] = matmul_tn(dlow.view(T * B, -1), src).mul_(rd.scale)  # [k, in]
            else:
                g["weight"] = matmul_tn(dp, src).mul_(rd.scale)  # [out, in]
            per_round[rd.kind, rd.j] = g
        for name in p:
            if name.startswith("mogrifier_"):
                kind, part = name[len("mogrifier_") :].split("_", 1)
                grads[name] = torch.stack([per_round[kind, i][part] for i in range(p[name].shape[0])])
    return _finish(spec, needs, p, dx_all, dh_next, dc_next, dG2, grads)


def _finish(spec: LayerSpec, needs, p: Params, dx, dh0, dc0, dG2: Tensor, grads: dict) -> tuple:
    """Gradients in the Function's input order, with the gate rows back in torch's order."""
    if grads:
        perm = gate_permutation(spec.hidden_size, dG2.device)
        grads["weight_ih"] = grads["weight_ih"].index_select(0, perm)
        grads["weight_hh"] = grads["weight_hh"].index_select(0, perm)
        if "bias_ih" in p:
            grads["bias_ih"] = grads["bias_hh"] = dG2.sum(0).index_select(0, perm)  # [4n]
    out = [dx, dh0, dc0, None, *(grads.get(name) for name in spec.names)]
    return tuple(g if need else None for g, need in zip(out, needs))


class FusedLSTMFunction(torch.autograd.Function):
    """Autograd over a whole window: ``apply(spec, cell, xs, h0, c0, mask, *params) -> (ys, h_T, c_T)``."""

    forward_impl = staticmethod(fused_forward)
    backward_impl = staticmethod(fused_backward)

    @classmethod
    def forward(cls, ctx, spec, cell, xs, h0, c0, mask, *params):
        ys, h_T, c_T, saved = cls.forward_impl(spec, xs, h0, c0, mask, dict(zip(spec.names, params)), save=True)
        ctx.spec, ctx.cell, ctx.low = spec, cell, product_dtype()
        flat, ctx.layout = flatten_saved(saved)
        ctx.save_for_backward(xs, h0, c0, mask, *params, ys, *flat)
        return ys, h_T, c_T

    @classmethod
    def backward(cls, ctx, dys, dh_T, dc_T):
        spec = ctx.spec
        tensors = ctx.saved_tensors
        k = 4 + len(spec.names)
        needs = ctx.needs_input_grad[2:]
        if torch.is_grad_enabled():  # create_graph=True: differentiate the reference loop instead
            grads = double_backward_by_reference(ctx.cell, spec.names, needs, tensors[:k], (dys, dh_T, dc_T))
            return (None, None, *grads)
        xs, h0, c0, mask = tensors[:4]
        p = dict(zip(spec.names, tensors[4:k]))
        saved = unflatten_saved(tensors[k + 1 :], ctx.layout)
        if ctx.low is None:
            grads = cls.backward_impl(spec, needs, xs, h0, c0, mask, p, tensors[k], saved, dys, dh_T, dc_T)
        else:
            with low_precision_products(ctx.low), torch.autocast(xs.device.type, enabled=False):
                grads = cls.backward_impl(spec, needs, xs, h0, c0, mask, p, tensors[k], saved, dys, dh_T, dc_T)
        return (None, None, *grads)


def run_fused(function, cell, params: Params, xs: Tensor, state, h_mask: Tensor | None):
    """Run ``function`` (a fused autograd Function) over ``xs`` ``[T, B, m]``; ``(ys, (h_T, c_T))``.
    Without anything to differentiate, only the forward runs, with reused per-step buffers.

    Under autocast (bf16/fp16) the window runs in float32 with its products in the autocast dtype
    (:func:`moglm.recurrence.gemm.low_precision_products`): float32 states, cell and results, as cuDNN's
    LSTM keeps under autocast its cell state and accumulation in float32."""
    low = autocast_dtype(xs)
    if low is not None:
        xs, state = xs.float(), tuple(s.float() for s in state)
        h_mask = h_mask.float() if h_mask is not None else None
        with low_precision_products(low), torch.autocast(xs.device.type, enabled=False):
            return _run_fused(function, cell, params, xs, state, h_mask)
    return _run_fused(function, cell, params, xs, state, h_mask)


def _run_fused(function, cell, params: Params, xs: Tensor, state, h_mask: Tensor | None):
    spec = layer_spec(cell, params)
    xs = xs.contiguous()
    h0, c0 = (s.contiguous() for s in state)
    values = tuple(params.values())
    training = torch.is_grad_enabled() and any(t.requires_grad for t in (xs, h0, c0, *values))
    if cuda_graphs.applies(xs):  # one launch per window (off unless enabled)
        if training:
            ys, h_T, c_T = cuda_graphs.graphed_training_window(function, spec, cell, xs, h0, c0, h_mask, values)
        else:
            ys, h_T, c_T = cuda_graphs.graphed_forward_window(function.forward_impl, spec, cell, xs, h0, c0, h_mask,
                                                              params)
    elif training:
        ys, h_T, c_T = function.apply(spec, cell, xs, h0, c0, h_mask, *values)
    else:
        ys, h_T, c_T, _ = function.forward_impl(spec, xs, h0, c0, h_mask, params, save=False)
    return ys, (h_T, c_T)


def fused_lstm_layer(cell, params: Params, xs: Tensor, state, h_mask: Tensor | None):
    """Run an LSTM or Mogrifier LSTM layer over ``xs`` ``[T, B, m]``; returns ``(ys, (h_T, c_T))``."""
    return run_fused(FusedLSTMFunction, cell, params, xs, state, h_mask)
