"""Fused multiplicative LSTM recurrence (Krause's thesis, section 3.3, eq. 3.5-3.9): one autograd node
per layer and window, arranged like :mod:`moglm.recurrence.fused_lstm`::

    h~  = h_{t-1} * mask                                   variational state dropout (mask optional)
    m_t = (W_mx x_t) * (W_mh h~)                           eq. 3.5
    [i, f, j, o] = W_ih x_t + W_hh m_t + b_ih + b_hh        an LSTM with m_t in place of h_{t-1}

Both input projections (``W_ih x + b`` and ``W_mx x``) are computed for many steps at once; a step does
the two products that depend on the recurrence, ``W_mh h~`` and ``W_hh m``. Backward propagates data
gradients step by step and computes the four weight gradients after the loop, over all T*B rows.
Saved: gate activations ``[T, B, 4n]``, c, m, ``W_mx x``, ``W_mh h~`` (each ``[T, B, n]``) and h~ under
state dropout.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..cells.base import Params
from .fused_cell import (
    BackwardScratch,
    gate_permutation,
    h_prev_all,
    lstm_weights,
    per_step,
)
from .fused_lstm import FusedLSTMFunction, run_fused
from .gemm import CHUNK_ROWS, Linear, matmul_tn
from .triton_pointwise import pointwise_for


def mlstm_forward(spec, xs: Tensor, h0: Tensor, c0: Tensor, mask: Tensor | None, p: Params, save: bool):
    """Run the window; returns ``(ys [T, B, n], h_T, c_T, saved or None)``."""
    T, B, m = xs.shape
    n = spec.hidden_size
    w_ih, w_hh, bias = lstm_weights(p, n, xs.device, forward=True)
    pointwise = pointwise_for(xs)  # torch ops, or one Triton kernel each on CUDA
    gates_x = Linear(w_ih, bias, CHUNK_ROWS)  # x -> W_ih x + b
    gates_m = Linear(w_hh, None, B)  # m -> W_hh m (+ the input part)
    proj_h = Linear(p["weight_mh"], None, B)  # h~ -> W_mh h~
    x_m = Linear(p["weight_mx"], None, CHUNK_ROWS).rows(xs.view(T * B, m)).view(T, B, n)  # W_mx x [T, B, n]
    S = T if save else 1
    ys = xs.new_empty(T, B, n)  # [T, B, n]
    cs = xs.new_empty(T if save else 2, B, n)  # [T, B, n]
    ms = xs.new_empty(S, B, n)  # m_t [S, B, n]
    hm = xs.new_empty(S, B, n) if mask is not None else None  # h~ [S, B, n]
    tc = xs.new_empty(B, n)
    acts: list[Tensor] = []  # T x [B, 4n]
    a_h: list[Tensor] = []  # W_mh h~, T x [B, n]
    chunk = max(1, CHUNK_ROWS // B) if gates_x.onednn else T
    ys_t, x_m_t, ms_t = ys.unbind(0), x_m.unbind(0), per_step(ms, T, save)
    cs_t = cs.unbind(0) if save else [cs[t % 2] for t in range(T)]
    h_prev_t, c_prev_t = [h0, *ys_t[:-1]], [c0, *cs_t[:-1]]
    hm_t = per_step(hm, T, save) if mask is not None else h_prev_t
    for t in range(T):
        if t % chunk == 0:
            steps = min(chunk, T - t)
            xp_t = gates_x(xs[t : t + steps].reshape(steps * B, m)).view(steps, B, 4 * n).unbind(0)  # W_ih x + b
        if mask is not None:
            torch.mul(h_prev_t[t], mask, out=hm_t[t])  # h~ [B, n]
        a = proj_h(hm_t[t])  # W_mh h~ [B, n]
        torch.mul(x_m_t[t], a, out=ms_t[t])  # m_t [B, n]
        g = gates_m(ms_t[t], add=xp_t[t % chunk])  # [B, 4n]
        pointwise.cell_forward(g, c_prev_t[t], cs_t[t], ys_t[t], tc, spec.capped)
        if save:
            acts.append(g)
            a_h.append(a)
    saved = {"acts": acts, "a_h": a_h, "cs": cs, "ms": ms, "hm": hm, "x_m": x_m} if save else None
    return ys, ys[-1].clone(), cs_t[-1].clone(), saved


def mlstm_backward(spec, needs, xs, h0, c0, mask, p: Params, ys, saved, dys, dh_T, dc_T) -> tuple:
    """Gradients for ``(xs, h0, c0, mask, *params)`` (``None`` where ``needs`` is False)."""
    T, B, m = xs.shape
    n = spec.hidden_size
    w_ih, w_hh, _ = lstm_weights(p, n, xs.device, forward=False)
    pointwise = pointwise_for(xs)
    acts, a_h, cs, ms, hm, x_m = (saved[k] for k in ("acts", "a_h", "cs", "ms", "hm", "x_m"))
    d_m = Linear(w_hh.t(), None, B)  # dG -> dm
    d_h = Linear(p["weight_mh"].t(), None, B)  # d(W_mh h~) -> dh~
    dG = xs.new_empty(T, B, 4 * n)  # [T, B, 4n]
    d_xm = xs.new_empty(T, B, n)  # dL/d(W_mx x) [T, B, n]
    d_ah = xs.new_empty(T, B, n)  # dL/d(W_mh h~) [T, B, n]
    da = BackwardScratch(xs, B, n)
    dG_t, dg_ifo_t, dg_j_t = dG.unbind(0), dG[:, :, : 3 * n].unbind(0), dG[:, :, 3 * n :].unbind(0)
    d_xm_t, d_ah_t, x_m_t, dys_t, cs_t = d_xm.unbind(0), d_ah.unbind(0), x_m.unbind(0), dys.unbind(0), cs.unbind(0)
    c_prev_t = [c0, *cs_t[:-1]]
    dh_next, dc_next = dh_T, dc_T
    for t in range(T - 1, -1, -1):
        dh = dys_t[t] + dh_next
        dc_next = pointwise.cell_backward(dh, dc_next, acts[t], c_prev_t[t], cs_t[t], da, dg_ifo_t[t], dg_j_t[t],
                                          spec.capped)
        dm = d_m(dG_t[t])  # [B, n]
        torch.mul(dm, a_h[t], out=d_xm_t[t])
        torch.mul(dm, x_m_t[t], out=d_ah_t[t])
        dh_next = d_h(d_ah_t[t])  # dL/dh~ [B, n]
        if mask is not None:
            dh_next.mul_(mask)
    dG2, d_xm2, d_ah2 = dG.view(T * B, 4 * n), d_xm.view(T * B, n), d_ah.view(T * B, n)
    dx = None
    if needs[0]:
        dx = Linear(w_ih.t(), None, CHUNK_ROWS).rows(dG2)  # [TB, m]
        dx += Linear(p["weight_mx"].t(), None, CHUNK_ROWS).rows(d_xm2)
        dx = dx.view(T, B, m)
    out = {}
    if any(needs[4:]):
        perm = gate_permutation(n, xs.device)
        x2 = xs.view(T * B, m)
        w_x, w_m = matmul_tn(dG2, x2, ms.view(T * B, n))  # [4n, m], [4n, n]
        out["weight_ih"], out["weight_hh"] = w_x.index_select(0, perm), w_m.index_select(0, perm)
        out["weight_mx"] = matmul_tn(d_xm2, x2)  # [n, m]
        hh = hm if mask is not None else h_prev_all(h0, ys)  # [T, B, n]
        out["weight_mh"] = matmul_tn(d_ah2, hh.reshape(T * B, n))  # [n, n]
        if "bias_ih" in p:
            out["bias_ih"] = out["bias_hh"] = dG2.sum(0).index_select(0, perm)  # [4n]
    grads = [dx, dh_next, dc_next, None, *(out.get(name) for name in spec.names)]
    return tuple(g if need else None for g, need in zip(grads, needs))


class FusedMultiplicativeLSTMFunction(FusedLSTMFunction):
    """``apply(spec, cell, xs, h0, c0, mask, *params) -> (ys, h_T, c_T)`` over a whole window."""

    forward_impl = staticmethod(mlstm_forward)
    backward_impl = staticmethod(mlstm_backward)


def fused_multiplicative_lstm_layer(cell, params: Params, xs: Tensor, state, h_mask: Tensor | None):
    """Run a multiplicative LSTM layer over ``xs`` ``[T, B, m]``; returns ``(ys, (h_T, c_T))``."""
    return run_fused(FusedMultiplicativeLSTMFunction, cell, params, xs, state, h_mask)
