"""A low-rank Mogrifier round as one Triton kernel, forward and backward (the GPU path's rounds).

A round of the Mogrifier (paper eq. 1 with the low-rank factorisation of section 2, ``Q = Q_left Q_right``)
updates one chain from the other: ``low = src^ (2^j Q_right)^T`` ``[B, k]``, ``p = low Q_left^T + b``
``[B, out]``, ``next^ = sigmoid(p) * old^``. On a GPU the window ran this as two cuBLAS products and one
pointwise kernel, with cuBLAS often adding a split-K reduction: at B = 64 and H = 650 the products are too
small to fill the GPU (``[64, 650] x [650, 64]``: one tile), so each step's ten dependent launches of the five
rounds bound its time (the profile in docs/fused-recurrence.md). Here a round is one launch:

* ``round_forward_kernel``: program ``(b, c)`` takes ``BLOCK_B`` batch rows and output columns block ``c``;
  it computes its rows' ``low`` itself (each column block recomputes it: ``2 B in k`` multiply-adds, cheap
  next to a launch) with ``tl.dot``, then its block of ``p``, the gate and ``next``. Column block 0 stores
  ``low`` for the backward's weight gradients.
* ``round_backward_kernel``: program ``(b, c)`` recomputes ``dp = dnext * old * g (1 - g)`` over all output
  columns of its rows and ``dlow = dp Q_left`` ``[B, k]``, then writes input columns block ``c`` of
  ``d src^ = add + dlow (2^j Q_right)``; column block 0 also stores ``dp``, ``dold = dnext * g`` and
  ``dlow``.

:class:`TorchRounds` is the twin in torch ops (what CPU runs, and what the tests compare with). The
kernels take float32 tensors (their products as ``tl.dot`` in IEEE float32, or in TF32 when
``torch.backends.cuda.matmul.allow_tf32`` allows it for cuBLAS); other dtypes, and products under
autocast, run the twin.

The kernels are off by default (``MOGLM_TRITON_ROUNDS=1`` turns them on): on an H200 they were slower than
the two cuBLAS products and the pointwise kernel they replace (37 and 30 microseconds per launch forward and
backward at B = 64, H = 650, k = 64, against about 22 and 20 for the three launches; the Mogrifier's
graphed training step went from 20 to 32 ms). Each program reduces over the whole input width in a serial
loop of ``tl.dot`` steps, so the launch is bound by that loop's latency, as cuBLAS's single-tile product
is; ``benchmarks/round_kernels.py`` times the block shapes, and docs/fused-recurrence.md says what would
close the gap.
"""

from __future__ import annotations

import functools
import os

import torch
from torch import Tensor

from .gemm import product_dtype
from .triton_pointwise import interpreting, row_stride, tl, triton_missing

#: the launch configuration: batch rows per program, the column block of the output (``BLOCK_N``) and of
#: the reduction (``BLOCK_K``), warps per program (benchmarks/round_kernels.py times others)
CONFIG = {"BLOCK_B": 16, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4}


class TorchRounds:
    """A low-rank round in torch ops (the twin of the kernels)."""

    name = "torch"

    @staticmethod
    def forward(src: Tensor, right: Tensor, left: Tensor, bias: Tensor | None, old: Tensor, sg: Tensor,
                new: Tensor) -> Tensor:
        """``low = src right^T`` (returned, ``[B, k]``); ``sg = sigmoid(low left^T + bias)``, ``new = sg * old``."""
        low = src @ right.t()  # [B, k]
        pre = low @ left.t() if bias is None else torch.addmm(bias, low, left.t())  # [B, out]
        torch.mul(old, torch.sigmoid(pre, out=sg), out=new)
        return low

    @staticmethod
    def backward(dnew: Tensor, old: Tensor, sg: Tensor, dp: Tensor, left: Tensor, right: Tensor,
                 add: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """``dp = dnew * old * sg (1 - sg)`` written into ``dp``; returns ``(dold = dnew * sg,
        dlow = dp left [B, k], d src = add + dlow right [B, in])``."""
        torch.mul(dnew, old, out=dp)
        dp.mul_(sg * (1 - sg))
        dlow = dp @ left  # [B, k]
        d_src = dlow @ right if add is None else torch.addmm(add, dlow, right)  # [B, in]
        return dnew * sg, dlow, d_src


def rounds_for(t: Tensor):
    """The kernels when ``MOGLM_TRITON_ROUNDS=1``, for a float32 window on CUDA (or anywhere under
    ``TRITON_INTERPRET=1``) with Triton installed and products in float32; else :class:`TorchRounds`."""
    if (os.environ.get("MOGLM_TRITON_ROUNDS", "0") in ("1", "round") and t.dtype == torch.float32
            and (t.is_cuda or interpreting()) and triton_missing() is None and product_dtype() is None):
        return TritonRounds
    return TorchRounds


def round_forward_kernel(src, ss, right, left, bias, old, os_, sg, sgs, new, ns, low,
                         B, n_in, n_out, k,
                         HAS_BIAS: tl.constexpr, PREC: tl.constexpr, KP: tl.constexpr,
                         BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    rok = rows < B
    kk = tl.arange(0, KP)
    kok = kk < k
    acc = tl.full((BLOCK_B, KP), 0.0, tl.float32)  # low for these rows [BLOCK_B, k]
    for start in range(0, n_in, BLOCK_K):
        ci = start + tl.arange(0, BLOCK_K)
        iok = ci < n_in
        a = tl.load(src + rows[:, None] * ss + ci[None, :], mask=rok[:, None] & iok[None, :], other=0.0)
        w = tl.load(right + kk[None, :] * n_in + ci[:, None], mask=kok[None, :] & iok[:, None], other=0.0)
        acc += tl.dot(a, w, input_precision=PREC)  # [BLOCK_B, KP]
    if tl.program_id(1) == 0:
        tl.store(low + rows[:, None] * k + kk[None, :], acc, mask=rok[:, None] & kok[None, :])
    co = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ook = co < n_out
    wl = tl.load(left + co[None, :] * k + kk[:, None], mask=ook[None, :] & kok[:, None], other=0.0)  # [KP, N]
    pre = tl.dot(acc, wl, input_precision=PREC)  # [BLOCK_B, BLOCK_N]
    if HAS_BIAS:
        pre += tl.load(bias + co, mask=ook, other=0.0)[None, :]
    gate = 1.0 / (1.0 + tl.exp(-pre))
    ok = rok[:, None] & ook[None, :]
    tl.store(sg + rows[:, None] * sgs + co[None, :], gate, mask=ok)
    o = tl.load(old + rows[:, None] * os_ + co[None, :], mask=ok, other=0.0)
    tl.store(new + rows[:, None] * ns + co[None, :], gate * o, mask=ok)


def round_backward_kernel(dnew, dns, old, os_, sg, sgs, dp, dps, dold, dlow, left, right, add, adds, dsrc,
                          B, n_in, n_out, k,
                          HAS_ADD: tl.constexpr, PREC: tl.constexpr, KP: tl.constexpr,
                          BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    rok = rows < B
    kk = tl.arange(0, KP)
    kok = kk < k
    first = tl.program_id(1) == 0
    acc = tl.full((BLOCK_B, KP), 0.0, tl.float32)  # dlow for these rows [BLOCK_B, k]
    for start in range(0, n_out, BLOCK_K):
        co = start + tl.arange(0, BLOCK_K)
        ok = rok[:, None] & (co < n_out)[None, :]
        d = tl.load(dnew + rows[:, None] * dns + co[None, :], mask=ok, other=0.0)
        g = tl.load(sg + rows[:, None] * sgs + co[None, :], mask=ok, other=0.0)
        o = tl.load(old + rows[:, None] * os_ + co[None, :], mask=ok, other=0.0)
        dpc = d * o * g * (1.0 - g)  # [BLOCK_B, BLOCK_K]
        if first:
            tl.store(dp + rows[:, None] * dps + co[None, :], dpc, mask=ok)
            tl.store(dold + rows[:, None] * n_out + co[None, :], d * g, mask=ok)
        wl = tl.load(left + co[:, None] * k + kk[None, :], mask=(co < n_out)[:, None] & kok[None, :], other=0.0)
        acc += tl.dot(dpc, wl, input_precision=PREC)  # [BLOCK_B, KP]
    if first:
        tl.store(dlow + rows[:, None] * k + kk[None, :], acc, mask=rok[:, None] & kok[None, :])
    ci = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    iok = ci < n_in
    wr = tl.load(right + kk[:, None] * n_in + ci[None, :], mask=kok[:, None] & iok[None, :], other=0.0)  # [KP, N]
    ds = tl.dot(acc, wr, input_precision=PREC)  # [BLOCK_B, BLOCK_N]
    ok = rok[:, None] & iok[None, :]
    if HAS_ADD:
        ds += tl.load(add + rows[:, None] * adds + ci[None, :], mask=ok, other=0.0)
    tl.store(dsrc + rows[:, None] * n_in + ci[None, :], ds, mask=ok)


@functools.cache
def _kernels(interpret: bool):
    del interpret  # the cache key only (see triton_pointwise._kernels)
    import triton

    return triton.jit(round_forward_kernel), triton.jit(round_backward_kernel)


def _launch_shape(B: int, width: int, k: int):
    import triton

    grid = (triton.cdiv(B, CONFIG["BLOCK_B"]), max(1, triton.cdiv(width, CONFIG["BLOCK_N"])))
    return grid, max(16, triton.next_power_of_2(k))


def dot_precision() -> str:
    """``tl.dot``'s input precision for float32 operands: TF32 where cuBLAS may use it (compiled kernels only),
    else IEEE float32."""
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 and not interpreting() else "ieee"


class TritonRounds:
    """A low-rank round as one Triton kernel each way (same contracts as :class:`TorchRounds`)."""

    name = "triton"

    @staticmethod
    def forward(src: Tensor, right: Tensor, left: Tensor, bias: Tensor | None, old: Tensor, sg: Tensor,
                new: Tensor) -> Tensor:
        B, n_in = src.shape
        n_out, k = left.shape
        low = src.new_empty(B, k)  # [B, k]
        grid, kp = _launch_shape(B, n_out, k)
        if B:
            _kernels(interpreting())[0][grid](
                src, row_stride(src), right.contiguous(), left.contiguous(), bias if bias is not None else left,
                old, row_stride(old), sg, row_stride(sg), new, row_stride(new), low, B, n_in, n_out, k,
                HAS_BIAS=bias is not None, PREC=dot_precision(), KP=kp, **CONFIG)
        return low

    @staticmethod
    def backward(dnew: Tensor, old: Tensor, sg: Tensor, dp: Tensor, left: Tensor, right: Tensor,
                 add: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        B, n_out = dp.shape
        k, n_in = right.shape
        dold, dlow, d_src = dp.new_empty(B, n_out), dp.new_empty(B, k), dp.new_empty(B, n_in)
        grid, kp = _launch_shape(B, n_in, k)
        if B:
            _kernels(interpreting())[1][grid](
                dnew, row_stride(dnew), old, row_stride(old), sg, row_stride(sg), dp, row_stride(dp), dold,
                dlow, left.contiguous(), right.contiguous(), add if add is not None else d_src,
                row_stride(add) if add is not None else 0, d_src, B, n_in, n_out, k,
                HAS_ADD=add is not None, PREC=dot_precision(), KP=kp, **CONFIG)
        return dold, dlow, d_src
