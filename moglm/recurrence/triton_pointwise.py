"""The pointwise work of a fused step as Triton kernels: one launch where torch needs several.

A fused window (:mod:`moglm.recurrence.fused_lstm`, :mod:`moglm.recurrence.fused_multiplicative_lstm`)
does per step one GEMM per round and one for the gates; everything between them is pointwise. On a GPU
each torch op is a kernel launch, so the cell alone would be about ten launches forward and fifteen
backward. Here each of these is one kernel:

* ``cell_forward``: activate ``[i, f, o, j]`` in place, ``c_t = f * c_{t-1} + i * j`` (capped input gate:
  ``min(1 - f, i) * j``), ``h_t = o * tanh(c_t)`` (Mogrifier paper eq. 2; docs/method.md "The LSTM cell");
* ``cell_backward``: the gate pre-activation gradients and dL/dc_{t-1} from dL/dh_t and dL/dc_t;
* ``round_forward``: one Mogrifier round, ``g = sigmoid(p)``, ``next = g * old`` (eq. 1; the factor 2 is
  folded into the weights, see fused_lstm);
* ``round_backward``: ``dp = dnext * old * g (1 - g)`` and ``dold = dnext * g``.

The contracts are those of :class:`TorchPointwise`, the torch-op twin used on CPU, and the tests run every
kernel under ``TRITON_INTERPRET=1`` (Triton's CPU interpreter) against it and against the reference loop.
Half-precision tensors are computed in float32 inside the kernels; float64 stays float64.

The kernels run where :func:`pointwise_for` picks them: CUDA tensors with Triton installed, or any tensor
when ``TRITON_INTERPRET=1`` is set (for tests). ``MOGLM_TRITON=0`` turns them off.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from types import SimpleNamespace

import torch
from torch import Tensor

from .fused_cell import BackwardScratch, _sigmoid_backward, cell_backward, cell_forward

try:
    import triton.language as tl
except ImportError:  # the torch ops run instead (pointwise_for)
    tl = None

#: elements per Triton program
BLOCK = 1024


class TorchPointwise:
    """The pointwise work of a step in torch ops (the twin of the Triton kernels)."""

    name = "torch"

    @staticmethod
    def cell_forward(g: Tensor, c_prev: Tensor, c_out: Tensor, h_out: Tensor, tc: Tensor, capped: bool) -> None:
        cell_forward(g, c_prev, c_out, h_out, tc, capped)

    @staticmethod
    def cell_backward(dh, dc_next, act, c_prev, c_t, da: BackwardScratch, dg_ifo, dg_j, capped: bool) -> Tensor:
        return cell_backward(dh, dc_next, act, c_prev, c_t, da, dg_ifo, dg_j, capped)

    @staticmethod
    def round_forward(pre: Tensor, old: Tensor, sg: Tensor, new: Tensor) -> None:
        """``sg = sigmoid(pre)``, ``new = sg * old`` (all ``[B, out]``)."""
        torch.mul(old, torch.sigmoid(pre, out=sg), out=new)

    @staticmethod
    def round_backward(dnew: Tensor, old: Tensor, sg: Tensor, dp: Tensor) -> Tensor:
        """``dp = dnew * old * sg (1 - sg)`` written into ``dp``; returns ``dold = dnew * sg``."""
        torch.mul(dnew, old, out=dp)
        _sigmoid_backward(dp, sg, grad_input=dp)
        return dnew * sg


def interpreting() -> bool:
    """Whether Triton runs its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_missing() -> str | None:
    """Why the Triton kernels cannot run here (``None`` if they can)."""
    if os.environ.get("MOGLM_TRITON", "1") == "0":
        return "MOGLM_TRITON=0"
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (pip install 'moglm[gpu]')"
    return None


def pointwise_for(t: Tensor):
    """The pointwise implementation for a window on ``t``'s device: the Triton kernels on CUDA (or anywhere
    under ``TRITON_INTERPRET=1``) when Triton is installed, else :class:`TorchPointwise`."""
    if (t.is_cuda or interpreting()) and triton_missing() is None:
        return TritonPointwise
    return TorchPointwise


# The kernels, as plain functions: :func:`_kernels` hands them to ``triton.jit`` on first use (Triton reads
# ``TRITON_INTERPRET`` when it decorates, and must not be needed to import moglm). ``ACC`` is the dtype the
# arithmetic runs in: float32 for float32 and half-precision tensors, float64 for float64. Only builtins are
# used (the sigmoid is written out): standard-library helpers like ``tl.sigmoid`` are jitted when triton is
# imported, and would not follow the interpreter switched on later.

def cell_forward_kernel(g, gs, c_prev, cps, c_out, cos, h_out, hos, total, n,
                        CAPPED: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < total
    row, col = offs // n, offs % n
    gp = g + row * gs + col
    i = 1.0 / (1.0 + tl.exp(-(tl.load(gp, mask=ok).to(ACC))))
    f = 1.0 / (1.0 + tl.exp(-(tl.load(gp + n, mask=ok).to(ACC))))
    o = 1.0 / (1.0 + tl.exp(-(tl.load(gp + 2 * n, mask=ok).to(ACC))))
    j = 2.0 / (1.0 + tl.exp(-(tl.load(gp + 3 * n, mask=ok).to(ACC)))) - 1.0  # the j pre-activation is doubled
    tl.store(gp, i, mask=ok)
    tl.store(gp + n, f, mask=ok)
    tl.store(gp + 2 * n, o, mask=ok)
    tl.store(gp + 3 * n, j, mask=ok)
    if CAPPED:
        i = tl.minimum(1.0 - f, i)
    c = f * tl.load(c_prev + row * cps + col, mask=ok).to(ACC) + i * j
    tl.store(c_out + row * cos + col, c, mask=ok)
    tl.store(h_out + row * hos + col, o * (2.0 / (1.0 + tl.exp(-(2.0 * c))) - 1.0), mask=ok)

def cell_backward_kernel(dh, dhs, dc_next, dcns, act, acs, c_prev, cps, c_t, cts, dg_ifo, dis, dg_j, djs,
                         dc_prev, total, n, CAPPED: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < total
    row, col = offs // n, offs % n
    ap = act + row * acs + col
    i = tl.load(ap, mask=ok).to(ACC)
    f = tl.load(ap + n, mask=ok).to(ACC)
    o = tl.load(ap + 2 * n, mask=ok).to(ACC)
    j = tl.load(ap + 3 * n, mask=ok).to(ACC)
    g_h = tl.load(dh + row * dhs + col, mask=ok).to(ACC)
    tc = 2.0 / (1.0 + tl.exp(-(2.0 * tl.load(c_t + row * cts + col, mask=ok).to(ACC)))) - 1.0
    dc = g_h * o * (1.0 - tc * tc) + tl.load(dc_next + row * dcns + col, mask=ok).to(ACC)  # dL/dc_t
    d_o = g_h * tc
    d_f = dc * tl.load(c_prev + row * cps + col, mask=ok).to(ACC)
    if CAPPED:
        one_minus_f = 1.0 - f
        d_capped = dc * j
        # torch.minimum's derivative: all to the smaller argument, half to each on a tie
        share = tl.where(i == one_minus_f, 0.5, tl.where(i < one_minus_f, 1.0, 0.0))
        d_i = d_capped * share
        d_f = d_f - d_capped + d_i
        d_j = dc * tl.minimum(one_minus_f, i)
    else:
        d_i = dc * j
        d_j = dc * i
    gp = dg_ifo + row * dis + col
    tl.store(gp, d_i * i * (1.0 - i), mask=ok)
    tl.store(gp + n, d_f * f * (1.0 - f), mask=ok)
    tl.store(gp + 2 * n, d_o * o * (1.0 - o), mask=ok)
    tl.store(dg_j + row * djs + col, d_j * (1.0 - j * j), mask=ok)
    tl.store(dc_prev + offs, dc * f, mask=ok)  # contiguous [B, n]

def round_forward_kernel(pre, ps, old, os_, sg, ss, new, ns, total, width,
                         ACC: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < total
    row, col = offs // width, offs % width
    gate = 1.0 / (1.0 + tl.exp(-(tl.load(pre + row * ps + col, mask=ok).to(ACC))))
    tl.store(sg + row * ss + col, gate, mask=ok)
    tl.store(new + row * ns + col, gate * tl.load(old + row * os_ + col, mask=ok).to(ACC), mask=ok)

def round_backward_kernel(dnew, dns, old, os_, sg, ss, dp, dps, dold, total, width,
                          ACC: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < total
    row, col = offs // width, offs % width
    d = tl.load(dnew + row * dns + col, mask=ok).to(ACC)
    gate = tl.load(sg + row * ss + col, mask=ok).to(ACC)
    tl.store(dp + row * dps + col, d * tl.load(old + row * os_ + col, mask=ok).to(ACC) * gate * (1.0 - gate),
             mask=ok)
    tl.store(dold + offs, d * gate, mask=ok)  # contiguous [B, width]


_KERNELS = ("cell_forward_kernel", "cell_backward_kernel", "round_forward_kernel", "round_backward_kernel")


@functools.cache
def _kernels(interpret: bool) -> SimpleNamespace:
    """The jitted kernels, once per mode (the argument is the cache key only)."""
    del interpret
    import triton

    return SimpleNamespace(**{name[: -len("_kernel")]: triton.jit(globals()[name]) for name in _KERNELS})


def _acc(t: Tensor):
    return tl.float64 if t.dtype == torch.float64 else tl.float32


def row_stride(t: Tensor) -> int:
    """The row stride of a ``[B, width]`` tensor whose rows are contiguous (a column slice of a wider buffer is
    fine); anything else is refused rather than read wrongly. Every Triton kernel of the GPU path reads its
    ``[B, width]`` operands this way."""
    if t.dim() != 2 or (t.shape[1] > 1 and t.stride(1) != 1):
        raise ValueError(f"Triton kernels need [B, width] tensors with contiguous rows, got shape "
                         f"{tuple(t.shape)} strides {t.stride()}")
    return t.stride(0)


def _rows(*tensors: Tensor) -> list[int]:
    return [row_stride(t) for t in tensors]


def _launch(kernel, total: int, *args, **constants) -> None:
    import triton

    if total:
        kernel[(triton.cdiv(total, BLOCK),)](*args, BLOCK=BLOCK, **constants)


class TritonPointwise:
    """The pointwise work of a step as one Triton kernel each (same contracts as :class:`TorchPointwise`)."""

    name = "triton"

    @staticmethod
    def cell_forward(g: Tensor, c_prev: Tensor, c_out: Tensor, h_out: Tensor, tc: Tensor, capped: bool) -> None:
        B, n = c_out.shape
        gs, cps, cos, hos = _rows(g, c_prev, c_out, h_out)
        _launch(_kernels(interpreting()).cell_forward, B * n, g, gs, c_prev, cps, c_out, cos, h_out, hos, B * n, n,
                CAPPED=capped, ACC=_acc(g))

    @staticmethod
    def cell_backward(dh, dc_next, act, c_prev, c_t, da: BackwardScratch, dg_ifo, dg_j, capped: bool) -> Tensor:
        B, n = c_t.shape
        dc_next = dc_next.contiguous()  # autograd may hand dL/dc_T over as an expanded (stride 0) tensor
        dc_prev = c_t.new_empty(B, n)  # [B, n]
        strides = _rows(dh, dc_next, act, c_prev, c_t, dg_ifo, dg_j)
        args = [a for pair in zip((dh, dc_next, act, c_prev, c_t, dg_ifo, dg_j), strides) for a in pair]
        _launch(_kernels(interpreting()).cell_backward, B * n, *args, dc_prev, B * n, n,
                CAPPED=capped, ACC=_acc(act))
        return dc_prev

    @staticmethod
    def round_forward(pre: Tensor, old: Tensor, sg: Tensor, new: Tensor) -> None:
        B, width = new.shape
        ps, os_, ss, ns = _rows(pre, old, sg, new)
        _launch(_kernels(interpreting()).round_forward, B * width, pre, ps, old, os_, sg, ss, new, ns, B * width,
                width, ACC=_acc(new))

    @staticmethod
    def round_backward(dnew: Tensor, old: Tensor, sg: Tensor, dp: Tensor) -> Tensor:
        B, width = dp.shape
        dold = dp.new_empty(B, width)  # [B, width]
        dns, os_, ss, dps = _rows(dnew, old, sg, dp)
        _launch(_kernels(interpreting()).round_backward, B * width, dnew, dns, old, os_, sg, ss, dp, dps, dold,
                B * width, width, ACC=_acc(dp))
        return dold
