"""Fused LSTM and Mogrifier LSTM recurrence: one autograd node per layer and window.

Equations (NOTES.md, "The Mogrifier step" and "The LSTM cell"; Melis et al. 2020, eq. 1-2)::

    h~  = h_{t-1} * mask                                   variational state dropout (mask optional)
    odd i:   x^i = 2 sigmoid(Q_i h + a_i) * x^{i-2}         even i:  h^i = 2 sigmoid(R_i x + b_i) * h^{i-2}
    [i, f, j, o] = [x_up; h_up] @ [W_ih; W_hh]^T + b_ih + b_hh
    c_t = f * c_{t-1} + i * j          (capped input gate: min(1 - f, i) * j)
    h_t = o * tanh(c_t)

How the work is arranged (docs/fused-recurrence.md has the measurements behind each choice):

* ``2 sigmoid(p) = 1 + tanh(p / 2)``: with Q_i, a_i pre-scaled by 1/2 once per call, a round is
  ``th = tanh(Q' src + a')``, ``x_new = x_old + th * x_old`` (one ``addcmul``), and its derivative is
  ``tanh_backward(dx_new * x_old, th)``.
* Gate blocks are permuted once per call to ``[i, f, o, j]``: one ``sigmoid_`` and one ``tanh_`` per step.
* Forward, per step: the rounds and one ``[x_up; h_up] @ W`` product. With ``rounds == 0`` the input
  projection is computed for many steps at once (:data:`~moglm.recurrence.gemm.CHUNK_ROWS` rows per GEMM)
  and each step only adds ``h~ @ W_hh^T``.
* Backward, per step: only data gradients (gates, rounds, ``dG @ W``). Every weight gradient is one
  product over all T*B rows after the loop, from the buffers the forward filled.
* Saved for backward: gate activations ``[T, B, 4n]``, c ``[T, B, n]``, ``[x_up; h_up]`` ``[T, B, m+n]``,
  per round its tanh ``[T, B, out]``, its intermediate x or h and (low rank) ``src @ right^T`` ``[T, B, k]``.
  All linear in T; ``tanh(c)`` is recomputed rather than stored.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..cells.base import Params
from .fallback import double_backward_by_reference
from .gemm import CHUNK_ROWS, Linear, matmul_tn

_tanh_backward = torch.ops.aten.tanh_backward.grad_input
_sigmoid_backward = torch.ops.aten.sigmoid_backward.grad_input


@dataclass(frozen=True)
class LayerSpec:
    """Static description of one layer for the fused path."""

    input_size: int
    hidden_size: int
    rounds: int
    rank: int  # 0: full rank
    zigzag: bool
    capped: bool
    names: tuple[str, ...]  # parameter names, in the order they are passed to the autograd Function


def layer_spec(cell, params: Params) -> LayerSpec:
    return LayerSpec(
        cell.input_size,
        cell.hidden_size,
        getattr(cell, "rounds", 0),
        getattr(cell, "rank", 0),
        getattr(cell, "zigzag", True),
        cell.capped_input_gate,
        tuple(params),
    )


def gate_permutation(n: int, device: torch.device) -> Tensor:
    """Row order taking torch's gate blocks ``[i, f, j, o]`` to ``[i, f, o, j]`` (its own inverse)."""
    return torch.cat([torch.arange(0, 2 * n), torch.arange(3 * n, 4 * n), torch.arange(2 * n, 3 * n)]).to(device)


# -- the LSTM cell, on [i, f, o, j] gate blocks ---------------------------------------------------------
def cell_forward(g: Tensor, c_prev: Tensor, c_out: Tensor, h_out: Tensor, tc: Tensor, capped: bool) -> None:
    """Activate pre-activations ``g`` ``[B, 4n]`` in place; write c_t to ``c_out`` and h_t to ``h_out``."""
    n = c_prev.shape[-1]
    g[:, : 3 * n].sigmoid_()
    g[:, 3 * n :].tanh_()
    i, f, o, j = g[:, :n], g[:, n : 2 * n], g[:, 2 * n : 3 * n], g[:, 3 * n :]  # each [B, n]
    if capped:
        i = torch.minimum(torch.rsub(f, 1.0), i)  # [B, n]
    torch.mul(f, c_prev, out=c_out).addcmul_(i, j)  # c_t [B, n]
    torch.tanh(c_out, out=tc)
    torch.mul(o, tc, out=h_out)  # h_t [B, n]


def cell_backward(
    dh: Tensor, dc_next: Tensor, act: Tensor, c_prev: Tensor, c_t: Tensor, da: Tensor, dg: Tensor, capped: bool
) -> Tensor:
    """Gate pre-activation gradient into ``dg`` ``[B, 4n]`` from dL/dh_t and dL/dc_t (carried); returns
    dL/dc_{t-1} through the cell. ``da`` ``[B, 4n]`` is scratch for the gradients of the activations."""
    n = c_prev.shape[-1]
    i, f, o, j = act[:, :n], act[:, n : 2 * n], act[:, 2 * n : 3 * n], act[:, 3 * n :]  # each [B, n]
    tc = torch.tanh(c_t)  # [B, n]
    dc = torch.mul(dh, o)
    _tanh_backward(dc, tc, grad_input=dc)
    dc.add_(dc_next)  # dL/dc_t [B, n]
    torch.mul(dh, tc, out=da[:, 2 * n : 3 * n])  # d o
    torch.mul(dc, c_prev, out=da[:, n : 2 * n])  # d f (direct)
    if capped:
        one_minus_f = torch.rsub(f, 1.0)
        d_capped = torch.mul(dc, j)  # d min(1-f, i)
        # torch.minimum's derivative: all to the smaller argument, half to each on a tie
        share_i = torch.where(i == one_minus_f, 0.5, (i < one_minus_f).to(dc.dtype))
        torch.mul(d_capped, share_i, out=da[:, :n])  # d i
        da[:, n : 2 * n].sub_(d_capped).add_(da[:, :n])  # d f -= d_capped - d i
        torch.mul(dc, torch.minimum(one_minus_f, i), out=da[:, 3 * n :])  # d j
    else:
        torch.mul(dc, j, out=da[:, :n])  # d i
        torch.mul(dc, i, out=da[:, 3 * n :])  # d j
    _sigmoid_backward(da[:, : 3 * n], act[:, : 3 * n], grad_input=dg[:, : 3 * n])
    _tanh_backward(da[:, 3 * n :], j, grad_input=dg[:, 3 * n :])
    return dc.mul_(f)  # dL/dc_{t-1} [B, n]


# -- parameters -----------------------------------------------------------------------------------------
class _Round:
    """One mogrifier round: target ``"x"`` (odd, Q) or ``"h"`` (even, R), its chain index and matrices."""

    def __init__(self, spec: LayerSpec, p: Params, i: int) -> None:
        kind, index = ("q", (i - 1) // 2) if i % 2 == 1 else ("r", i // 2 - 1)
        self.kind, self.index, self.target = kind, index, "x" if kind == "q" else "h"
        self.j = index  # the target's chain index before this round (after it: j + 1)
        prefix = f"mogrifier_{kind}_"
        self.bias = p[prefix + "bias"][index] if prefix + "bias" in p else None  # [out]
        if spec.rank > 0:
            self.left, self.right = p[prefix + "left"][index], p[prefix + "right"][index]  # [out, k], [k, in]
        else:
            self.full = p[prefix + "weight"][index]  # [out, in]

    def forward_ops(self, rows: int) -> None:
        bias = None if self.bias is None else 0.5 * self.bias
        if hasattr(self, "full"):
            self.pre = Linear(0.5 * self.full, bias, rows)  # src -> p/2
        else:
            self.low = Linear(self.right, None, rows)  # src -> src @ right^T [B, k]
            self.pre = Linear(0.5 * self.left, bias, rows)  # low -> p/2

    def backward_ops(self, rows: int) -> None:
        if hasattr(self, "full"):
            self.d_src = Linear((0.5 * self.full).t(), None, rows)  # dp -> dsrc
        else:
            self.d_low = Linear((0.5 * self.left).t(), None, rows)  # dp -> dlow [B, k]
            self.d_src = Linear(self.right.t(), None, rows)  # dlow -> dsrc


def prepared_lstm_weights(spec: LayerSpec, p: Params, device: torch.device) -> tuple[Tensor, Tensor, Tensor | None]:
    perm = gate_permutation(spec.hidden_size, device)
    w_ih = p["weight_ih"].index_select(0, perm)  # [4n, m]
    w_hh = p["weight_hh"].index_select(0, perm)  # [4n, n]
    bias = (p["bias_ih"] + p["bias_hh"]).index_select(0, perm) if "bias_ih" in p else None  # [4n]
    return w_ih, w_hh, bias


# -- forward --------------------------------------------------------------------------------------------
def fused_forward(spec: LayerSpec, xs: Tensor, h0: Tensor, c0: Tensor, mask: Tensor | None, p: Params, save: bool):
    """Run the window. Returns ``(ys [T, B, n], h_T, c_T, saved)``; ``saved`` (a dict of the buffers
    backward needs) is ``None`` unless ``save``. Without ``save`` the per-step buffers are reused."""
    T, B, m = xs.shape
    n, r = spec.hidden_size, spec.rounds
    w_ih, w_hh, bias = prepared_lstm_weights(spec, p, xs.device)
    S = T if save else 1  # leading size of the per-step buffers
    ys = xs.new_empty(T, B, n)  # [T, B, n]
    cs = xs.new_empty(T if save else 2, B, n)  # [T, B, n]
    tc = xs.new_empty(B, n)  # tanh(c_t), scratch
    acts: list[Tensor] = []  # gate activations, T x [B, 4n]
    saved: dict = {"acts": acts, "cs": cs}
    hm = xs.new_empty(S, B, n) if mask is not None and (r == 0 or r >= 2) else None  # h~ [S, B, n]
    saved["hm"] = hm
    h_prev, c_prev = h0, c0
    if r == 0:
        gates_x = Linear(w_ih, bias, CHUNK_ROWS)
        gates_h = Linear(w_hh, None, B)
        chunk = max(1, CHUNK_ROWS // B) if gates_x.onednn else T
        for t in range(T):
            if t % chunk == 0:
                steps = min(chunk, T - t)
                xp = gates_x(xs[t : t + steps].reshape(steps * B, m)).view(steps, B, 4 * n)  # x W_ih^T + b
            s = t if save else 0
            hh = h_prev if mask is None else torch.mul(h_prev, mask, out=hm[s])  # h~ [B, n]
            g = gates_h(hh, add=xp[t % chunk])  # [B, 4n]
            c_out = cs[t] if save else cs[t % 2]
            cell_forward(g, c_prev, c_out, ys[t], tc, spec.capped)
            if save:
                acts.append(g)
            h_prev, c_prev = ys[t], c_out
        return ys, ys[-1].clone(), c_prev.clone(), saved if save else None

    nq, nr = (r + 1) // 2, r // 2
    rounds = [_Round(spec, p, i) for i in range(1, r + 1)]
    for rd in rounds:
        rd.forward_ops(B)
    gates = Linear(torch.cat([w_ih, w_hh], 1), bias, B)  # [x_up; h_up] -> gates
    xh = xs.new_empty(S, B, m + n)  # [x_up; h_up] [S, B, m+n]
    xc = [xs.new_empty(S, B, m) for _ in range(nq - 1)]  # x^1 .. x^{nq-1}, each [S, B, m]
    hc = [xs.new_empty(S, B, n) for _ in range(nr - 1)]  # h^1 .. h^{nr-1}, each [S, B, n]
    ths = [xs.new_empty(S, B, m if rd.kind == "q" else n) for rd in rounds]  # tanh(p/2) per round
    lows: list[list[Tensor]] = [[] for _ in rounds]  # low rank: T x [B, k] per round
    saved.update(xh=xh, xc=xc, hc=hc, ths=ths, lows=lows)
    for t in range(T):
        s = t if save else 0
        if nr == 0:  # h~ is h_up itself
            h_first = xh[s, :, m:]
            torch.mul(h_prev, mask, out=h_first) if mask is not None else h_first.copy_(h_prev)
        else:
            h_first = h_prev if mask is None else torch.mul(h_prev, mask, out=hm[s])  # [B, n]
        xchain = [xs[t], *(b[s] for b in xc), xh[s, :, :m]]  # x^0 .. x^nq
        hchain = [h_first, *(b[s] for b in hc), xh[s, :, m:]] if nr else [h_first]  # h^0 .. h^nr
        for k, rd in enumerate(rounds):
            own, other = (xchain, hchain) if rd.target == "x" else (hchain, xchain)
            old, new = own[rd.j], own[rd.j + 1]
            src = (other[rd.j] if rd.target == "x" else other[rd.j + 1]) if spec.zigzag else other[0]
            if spec.rank > 0:
                low = rd.low(src)  # [B, k]
                pre = rd.pre(low)  # [B, out]
                if save:
                    lows[k].append(low)
            else:
                pre = rd.pre(src)  # [B, out]
            th = torch.tanh(pre, out=ths[k][s])  # tanh(p/2) = 2 sigmoid(p) - 1
            torch.addcmul(old, th, old, out=new)  # new = 2 sigmoid(p) * old
        g = gates(xh[s])  # [B, 4n]
        c_out = cs[t] if save else cs[t % 2]
        cell_forward(g, c_prev, c_out, ys[t], tc, spec.capped)
        if save:
            acts.append(g)
        h_prev, c_prev = ys[t], c_out
    return ys, ys[-1].clone(), c_prev.clone(), saved if save else None


# -- backward -------------------------------------------------------------------------------------------
def h_prev_all(h0: Tensor, ys: Tensor) -> Tensor:
    """h_{t-1} for every t: ``[T, B, n]``."""
    return torch.cat([h0.unsqueeze(0), ys[:-1]])


def fused_backward(spec: LayerSpec, needs: tuple[bool, ...], xs, h0, c0, mask, p: Params, ys, saved, dys, dh_T, dc_T):
    """Gradients for ``(xs, h0, c0, mask, *params)`` (``None`` where ``needs`` is False)."""
    T, B, m = xs.shape
    n, r = spec.hidden_size, spec.rounds
    w_ih, w_hh, _ = prepared_lstm_weights(spec, p, xs.device)
    acts, cs, hm = saved["acts"], saved["cs"], saved["hm"]
    dG = xs.new_empty(T, B, 4 * n)  # gate pre-activation gradients [T, B, 4n]
    da = xs.new_empty(B, 4 * n)  # scratch
    need_x = needs[0]
    dh_next, dc_next = dh_T, dc_T
    if r == 0:
        d_h = Linear(w_hh.t(), None, B)  # dG -> dh~
        for t in range(T - 1, -1, -1):
            dh = dys[t] + dh_next
            dc_next = cell_backward(dh, dc_next, acts[t], cs[t - 1] if t else c0, cs[t], da, dG[t], spec.capped)
            dh_next = d_h(dG[t])  # dL/dh~ [B, n]
            if mask is not None:
                dh_next.mul_(mask)
        dG2 = dG.view(T * B, 4 * n)
        dx = Linear(w_ih.t(), None, CHUNK_ROWS).rows(dG2).view(T, B, m) if need_x else None
        grads_w = {}
        if any(needs[4:]):
            grads_w["ih"] = matmul_tn(dG2, xs.reshape(T * B, m))  # [4n, m]
            hh = hm if mask is not None else h_prev_all(h0, ys)  # [T, B, n]
            grads_w["hh"] = matmul_tn(dG2, hh.reshape(T * B, n))  # [4n, n]
        return _collect(spec, needs, p, dx, dh_next, dc_next, dG2, grads_w, {})

    nq, nr = (r + 1) // 2, r // 2
    xh, xc, hc, ths, lows = saved["xh"], saved["xc"], saved["hc"], saved["ths"], saved["lows"]
    rounds = [_Round(spec, p, i) for i in range(1, r + 1)]
    for rd in rounds:
        rd.backward_ops(B)
    d_xh = Linear(torch.cat([w_ih, w_hh], 1).t(), None, B)  # dG -> [dx_up; dh_up]
    dps = [torch.empty_like(th) for th in ths]  # d(p/2) per round, [T, B, out]
    dlows: list[list] = [[None] * T for _ in rounds]  # low rank: dL/d(low) per round and step
    dx_all = xs.new_empty(T, B, m) if need_x else None
    for t in range(T - 1, -1, -1):
        dh = dys[t] + dh_next
        dc_next = cell_backward(dh, dc_next, acts[t], cs[t - 1] if t else c0, cs[t], da, dG[t], spec.capped)
        dxh = d_xh(dG[t])  # [B, m+n]
        grad = {"x": dxh[:, :m], "h": dxh[:, m:]}  # gradient of the chains' current ends
        extra = {"x": None, "h": None}  # no zigzag: gradient reaching x^0 / h^0 as round sources
        h_first = xh[t, :, m:] if nr == 0 else (hm[t] if mask is not None else (ys[t - 1] if t else h0))
        chain = {"x": [xs[t], *(b[t] for b in xc), xh[t, :, :m]], "h": [h_first, *(b[t] for b in hc), xh[t, :, m:]]}
        for k in range(r - 1, -1, -1):
            rd, th = rounds[k], ths[k][t]
            source = "h" if rd.target == "x" else "x"
            dnew = grad[rd.target]
            dp = _tanh_backward(dnew * chain[rd.target][rd.j], th, grad_input=dps[k][t])  # d(p/2) [B, out]
            grad[rd.target] = torch.addcmul(dnew, dnew, th)  # d old = d new * 2 sigmoid(p)
            if spec.rank > 0:
                dlows[k][t] = dlow = rd.d_low(dp)  # [B, k]
                dp = dlow
            if spec.zigzag:
                grad[source] = rd.d_src(dp, add=grad[source])
            else:
                extra[source] = rd.d_src(dp, add=extra[source])
        for name in ("x", "h"):
            if extra[name] is not None:
                grad[name] = grad[name] + extra[name]
        if need_x:
            dx_all[t].copy_(grad["x"])
        dh_next = grad["h"] if mask is None else grad["h"] * mask
    dG2 = dG.view(T * B, 4 * n)
    grads_w, grads_rounds = {}, {}
    if any(needs[4:]):
        grads_w["cat"] = matmul_tn(dG2, xh.view(T * B, m + n))  # [4n, m+n]
        h0_all = xh[:, :, m:] if nr == 0 else (hm if mask is not None else h_prev_all(h0, ys))
        xchain_all = [xs, *xc, xh[:, :, :m]]
        hchain_all = [h0_all, *hc, xh[:, :, m:]]
        for k, rd in enumerate(rounds):
            other = hchain_all if rd.target == "x" else xchain_all
            src = (other[rd.j] if rd.target == "x" else other[rd.j + 1]) if spec.zigzag else other[0]
            src = src.reshape(T * B, -1)  # [TB, in]
            dp = dps[k].view(T * B, -1)  # [TB, out]
            g = {"bias": 0.5 * dp.sum(0)}
            if spec.rank > 0:
                g["left"] = 0.5 * matmul_tn(dp, torch.stack(lows[k]).view(T * B, -1))  # [out, k]
                g["right"] = matmul_tn(torch.stack(dlows[k]).view(T * B, -1), src)  # [k, in]
            else:
                g["weight"] = 0.5 * matmul_tn(dp, src)  # [out, in]
            grads_rounds[(rd.kind, rd.index)] = g
    return _collect(spec, needs, p, dx_all, dh_next, dc_next, dG2, grads_w, grads_rounds)


def _collect(spec: LayerSpec, needs, p, dx, dh0, dc0, dG2, grads_w, grads_rounds) -> tuple:
    """Gradients in the Function's input order, gate blocks back in torch's order."""
    n, m = spec.hidden_size, spec.input_size
    perm = gate_permutation(n, dG2.device)
    out = {}
    if "cat" in grads_w:
        w = grads_w["cat"].index_select(0, perm)  # [4n, m+n]
        out["weight_ih"], out["weight_hh"] = w[:, :m], w[:, m:]
    elif grads_w:
        out["weight_ih"] = grads_w["ih"].index_select(0, perm)
        out["weight_hh"] = grads_w["hh"].index_select(0, perm)
    if grads_w and "bias_ih" in p:
        out["bias_ih"] = dG2.sum(0).index_select(0, perm)  # [4n]
        out["bias_hh"] = out["bias_ih"]
    for name in p:
        if name.startswith("mogrifier_") and grads_rounds:
            kind, part = name[len("mogrifier_") :].split("_", 1)
            count = p[name].shape[0]
            out[name] = torch.stack([grads_rounds[(kind, i)][part] for i in range(count)])
    grads = [dx, dh0, dc0, None]
    for k, name in enumerate(spec.names):
        grads.append(out.get(name) if needs[4 + k] else None)
    return tuple(g if need else None for g, need in zip(grads, needs))


def flatten_saved(saved: dict) -> tuple[list, list]:
    """Buffers dict -> (flat list for ``save_for_backward``, layout to rebuild it)."""
    flat: list = []
    layout: list = []
    for key, value in saved.items():
        if isinstance(value, list) and value and isinstance(value[0], list):
            layout.append((key, [len(v) for v in value]))
            for v in value:
                flat += v
        elif isinstance(value, list):
            layout.append((key, len(value)))
            flat += value
        else:
            layout.append((key, None))
            flat.append(value)
    return flat, layout


def unflatten_saved(flat, layout: list) -> dict:
    it = iter(flat)
    saved: dict = {}
    for key, shape in layout:
        if shape is None:
            saved[key] = next(it)
        elif isinstance(shape, int):
            saved[key] = [next(it) for _ in range(shape)]
        else:
            saved[key] = [[next(it) for _ in range(length)] for length in shape]
    return saved


class FusedLSTMFunction(torch.autograd.Function):
    """Autograd over a whole window: ``apply(spec, cell, xs, h0, c0, mask, *params) -> (ys, h_T, c_T)``."""

    @staticmethod
    def forward(ctx, spec, cell, xs, h0, c0, mask, *params):
        ys, h_T, c_T, saved = fused_forward(spec, xs, h0, c0, mask, dict(zip(spec.names, params)), save=True)
        ctx.spec, ctx.cell = spec, cell
        flat, ctx.layout = flatten_saved(saved)
        ctx.save_for_backward(xs, h0, c0, mask, *params, ys, *flat)
        return ys, h_T, c_T

    @staticmethod
    def backward(ctx, dys, dh_T, dc_T):
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
        grads = fused_backward(spec, needs, xs, h0, c0, mask, p, tensors[k], saved, dys, dh_T, dc_T)
        return (None, None, *grads)


def fused_lstm_layer(cell, params: Params, xs: Tensor, state, h_mask: Tensor | None):
    """Run an LSTM or Mogrifier LSTM layer over ``xs`` ``[T, B, m]``; returns ``(ys, (h_T, c_T))``."""
    spec = layer_spec(cell, params)
    xs = xs.contiguous()
    h0, c0 = (s.contiguous() for s in state)
    values = tuple(params.values())
    if torch.is_grad_enabled() and any(t.requires_grad for t in (xs, h0, c0, *values)):
        ys, h_T, c_T = FusedLSTMFunction.apply(spec, cell, xs, h0, c0, h_mask, *values)
    else:
        ys, h_T, c_T, _ = fused_forward(spec, xs, h0, c0, h_mask, params, save=False)
    return ys, (h_T, c_T)
