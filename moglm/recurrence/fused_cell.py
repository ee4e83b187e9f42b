"""The LSTM cell's pointwise step and its derivative, shared by the fused recurrences.

Gate blocks are permuted once per call from torch's ``[i, f, j, o]`` to ``[i, f, o, j]``, and the j rows
of the weights and bias are doubled, so that one in-place ``sigmoid_`` activates all four blocks:
``tanh(a) = 2 sigmoid(2a) - 1``. On CPU ``tanh(c)`` is computed the same way, because torch's CPU tanh is
several times slower than its sigmoid (docs/fused-recurrence.md). Equations (docs/method.md, "The LSTM cell")::

    c_t = f * c_{t-1} + i * j          (capped input gate: min(1 - f, i) * j)
    h_t = o * tanh(c_t)
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..cells.base import Params

_tanh_backward = torch.ops.aten.tanh_backward.grad_input
_sigmoid_backward = torch.ops.aten.sigmoid_backward.grad_input


def gate_permutation(n: int, device: torch.device) -> Tensor:
    """Row order taking torch's gate blocks ``[i, f, j, o]`` to ``[i, f, o, j]`` (its own inverse)."""
    return torch.cat([torch.arange(0, 2 * n, device=device), torch.arange(3 * n, 4 * n, device=device),
                      torch.arange(2 * n, 3 * n, device=device)])  # built on the device: no copy (graph capture)


def lstm_weights(p: Params, n: int, device: torch.device, forward: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    """``(W_ih [4n, m], W_hh [4n, n], b_ih + b_hh [4n] or None)`` in ``[i, f, o, j]`` row order; for the
    forward (``forward=True``) the j rows are doubled (see the module docstring)."""
    perm = gate_permutation(n, device)
    w_ih = p["weight_ih"].index_select(0, perm)  # [4n, m]
    w_hh = p["weight_hh"].index_select(0, perm)  # [4n, n]
    bias = (p["bias_ih"] + p["bias_hh"]).index_select(0, perm) if "bias_ih" in p else None  # [4n]
    if forward:
        for t in (w_ih, w_hh, bias):
            if t is not None:
                t[3 * n :] *= 2.0
    return w_ih, w_hh, bias


#: device types on which tanh is computed as 2 sigmoid(2x) - 1 (elsewhere torch.tanh, e.g. CUDA)
SIGMOID_TANH_DEVICES = {"cpu"}


def tanh_into(x: Tensor, out: Tensor) -> Tensor:
    """``out = tanh(x)``; on CPU as ``2 sigmoid(2x) - 1``."""
    if out.device.type in SIGMOID_TANH_DEVICES:
        return torch.mul(x, 2.0, out=out).sigmoid_().mul_(2.0).sub_(1.0)
    return torch.tanh(x, out=out)


def per_step(buf: Tensor, T: int, save: bool) -> list[Tensor]:
    """``[buf[0], ..., buf[T-1]]`` as views made in one call; without ``save`` the buffer has a single
    slot, reused by every step."""
    return list(buf.unbind(0)) if save else [buf[0]] * T


def cell_forward(g: Tensor, c_prev: Tensor, c_out: Tensor, h_out: Tensor, tc: Tensor, capped: bool) -> None:
    """Activate ``g`` ``[B, 4n]`` (pre-activations, j block doubled) in place into ``[i, f, o, j]``;
    write c_t to ``c_out`` and h_t to ``h_out``. ``tc`` ``[B, n]`` is scratch."""
    g.sigmoid_()
    i, f, o, j = g.view(g.shape[0], 4, -1).unbind(1)  # each [B, n]
    j.mul_(2.0).sub_(1.0)  # tanh of the j pre-activation
    if capped:
        i = torch.minimum(torch.rsub(f, 1.0), i)  # [B, n]
    torch.mul(f, c_prev, out=c_out).addcmul_(i, j)  # c_t [B, n]
    torch.mul(o, tanh_into(c_out, tc), out=h_out)  # h_t [B, n]


class BackwardScratch:
    """Reused ``[B, 4n]`` buffer for the gradients of the gate activations, and its views."""

    def __init__(self, like: Tensor, B: int, n: int) -> None:
        self.da = like.new_empty(B, 4 * n)
        self.i, self.f, self.o, self.j = self.da.view(B, 4, n).unbind(1)  # each [B, n]
        self.ifo = self.da[:, : 3 * n]  # [B, 3n]


def cell_backward(
    dh: Tensor, dc_next: Tensor, act: Tensor, c_prev: Tensor, c_t: Tensor, da: BackwardScratch,
    dg_ifo: Tensor, dg_j: Tensor, capped: bool,
) -> Tensor:
    """Gate pre-activation gradient into ``dg_ifo`` ``[B, 3n]`` and ``dg_j`` ``[B, n]`` from dL/dh_t (all of
    it) and the dL/dc_t carried from step t+1; returns dL/dc_{t-1}. The gradient is that of the un-doubled
    pre-activations, so it pairs with the plain (permuted) weights."""
    i, f, o, j = act.view(act.shape[0], 4, -1).unbind(1)  # each [B, n]
    tc = tanh_into(c_t, da.i)  # tanh(c_t) [B, n] (scratch: da.i is written last below)
    dc = torch.mul(dh, o)
    _tanh_backward(dc, tc, grad_input=dc)
    dc.add_(dc_next)  # dL/dc_t [B, n]
    torch.mul(dh, tc, out=da.o)  # d o
    torch.mul(dc, c_prev, out=da.f)  # d f (direct)
    if capped:
        one_minus_f = torch.rsub(f, 1.0)
        d_capped = torch.mul(dc, j)  # d min(1-f, i)
        # torch.minimum's derivative: all to the smaller argument, half to each on a tie
        share_i = torch.where(i == one_minus_f, 0.5, (i < one_minus_f).to(dc.dtype))
        torch.mul(d_capped, share_i, out=da.i)  # d i
        da.f.sub_(d_capped).add_(da.i)  # d f -= d_capped - d i
        torch.mul(dc, torch.minimum(one_minus_f, i), out=da.j)  # d j
    else:
        torch.mul(dc, i, out=da.j)  # d j
        torch.mul(dc, j, out=da.i)  # d i
    _sigmoid_backward(da.ifo, act[:, : 3 * i.shape[-1]], grad_input=dg_ifo)
    _tanh_backward(da.j, j, grad_input=dg_j)
    return dc.mul_(f)  # dL/dc_{t-1} [B, n]


def h_prev_all(h0: Tensor, ys: Tensor) -> Tensor:
    """h_{t-1} for every t: ``[T, B, n]``."""
    return torch.cat([h0.unsqueeze(0), ys[:-1]])


def flatten_saved(saved: dict) -> tuple[list, list]:
    """Buffers dict (tensors, lists, lists of lists) -> (flat list for ``save_for_backward``, layout)."""
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
