"""All the Mogrifier rounds of a time step in one Triton kernel, forward and backward.

The rounds of one step (Mogrifier paper eq. 1, low rank as in section 2: ``Q = Q_left Q_right``) form a
chain of ``2 r`` dependent products, ``low = src^ (2^j Q_right)^T`` ``[B, k]`` and ``p = low Q_left^T + b``
``[B, out]``, each followed by ``next^ = sigmoid(p) * old^``. On a GPU at B = 64 and H = 650 every one of
these products is a single output tile, so as cuBLAS calls and pointwise kernels a step is about 15 launches
whose latencies add up (docs/fused-recurrence.md, "Where the time goes"). But a batch row's rounds read only
that row's x and h: nothing crosses rows until the gate product. So here one program takes ``BLOCK_B`` rows
and runs all ``r`` rounds for them, reading the chains it has just written back from L1/L2 after a barrier:
one launch per step and direction instead of ``3 r``.

* ``step_forward_kernel``: for ``i = 1 .. r``: ``low`` for the program's rows (a loop of ``tl.dot`` over
  the source's columns), stored for the weight gradients; then, column block by column block, the gate
  ``sigmoid(low Q_left^T + b)`` and the next chain value. x^0 and h~ come in, x^nq and h^nr go out to the
  gate product's input ``[x^_up; h^_up]``.
* ``step_backward_kernel``: for ``i = r .. 1``: ``dp = dnext * old * g (1 - g)`` and ``dold = dnext * g``
  (in place over the running gradient of the target chain), ``dlow = dp Q_left``, then the source's
  gradient ``+= dlow (2^j Q_right)``. At the end it writes dL/dx^0 and dL/dh~ times the state-dropout mask.
  With ``zigzag = False`` every round reads x^0 / h~, whose gradients from the rounds are summed apart
  and added at the end, as the reference loop's autograd does.

Chains are stored divided by two per gate applied (:mod:`moglm.recurrence.fused_lstm`), so the factor 2 of
eq. 1 is folded into the matrices that read them. The intermediate values live in the window's stacked
buffers (``[count, B, width]`` per step), which the backward and the weight gradients read as they read the
per-round path's.

Opt-in (``MOGLM_TRITON_ROUNDS=step``): on an H200 at H = 650, B = 64 the graphed training window took 28.5
ms with these kernels against 13.9 for the per-round cuBLAS path (TF32; 48.2 against 20.3 in fp32). B / 16
programs use 4 of 132 SMs, each reducing the whole width in series, and that launch shape spilled registers
(docs/performance/nvidia-h200.md, "All the rounds of a step in one kernel").

:class:`TorchStepRounds` is the twin: the same contract as a loop of :class:`~.triton_rounds.TorchRounds`.
Float32 only (products in IEEE float32, TF32 when ``torch.backends.cuda.matmul.allow_tf32`` allows it, or
bf16/fp16 inputs with float32 accumulation under autocast); anything else runs the per-round path.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
from torch import Tensor

from .gemm import product_dtype
from .triton_pointwise import interpreting, row_stride, tl, triton_missing
from .triton_rounds import TorchRounds, dot_precision

#: batch rows per program, columns per block, warps and software-pipeline stages per program: the shape that
#: compiled for sm_90 without register spills forward and backward (64-column blocks with 4 warps and 3
#: stages spilled 4.7 KB per thread and ran a step 3x slower than cuBLAS; benchmarks/round_kernels.py times
#: others)
CONFIG = {"BLOCK_B": 16, "BLOCK_C": 32, "num_warps": 8, "num_stages": 2}


@dataclass(frozen=True)
class StepWeights:
    """The round matrices of a window as the step kernels read them, stacked per kind: ``q`` rounds gate x
    from h, ``r`` rounds gate h from x. ``*_right`` carry the source chain's factor ``2^j``."""

    q_right: Tensor  # [nq, k, n]
    q_left: Tensor  # [nq, m, k]
    q_bias: Tensor | None  # [nq, m]
    r_right: Tensor  # [nr, k, m]
    r_left: Tensor  # [nr, n, k]
    r_bias: Tensor | None  # [nr, n]
    zigzag: bool

    @property
    def rounds(self) -> int:
        return self.q_right.shape[0] + self.r_right.shape[0]

    def round(self, i: int) -> tuple[str, int, Tensor, Tensor, Tensor | None]:
        """Round ``i`` (1-based): ``(target chain, j, right, left, bias)``."""
        if i % 2:
            j = (i - 1) // 2
            return "x", j, self.q_right[j], self.q_left[j], None if self.q_bias is None else self.q_bias[j]
        j = i // 2 - 1
        return "h", j, self.r_right[j], self.r_left[j], None if self.r_bias is None else self.r_bias[j]

    def source_index(self, i: int) -> int:
        """The source chain's index that round ``i`` reads: h^j for x's round j, x^(j+1) for h's (zigzag)."""
        if not self.zigzag:
            return 0
        return (i - 1) // 2 if i % 2 else i // 2


def step_weights(p: dict, m: int, n: int, zigzag: bool) -> StepWeights:
    """Stack the low-rank factors of ``p`` with each ``right`` scaled by ``2^(source index)``."""
    q_right, r_right = p["mogrifier_q_right"], p.get("mogrifier_r_right")
    nq = q_right.shape[0]
    nr = 0 if r_right is None else r_right.shape[0]
    k = q_right.shape[1]
    if zigzag:
        q_right = q_right * (2.0 ** torch.arange(nq, device=q_right.device, dtype=q_right.dtype))[:, None, None]
        if nr:
            r_right = r_right * (2.0 ** torch.arange(1, nr + 1, device=r_right.device,
                                                     dtype=r_right.dtype))[:, None, None]
    empty = q_right.new_empty(0, k, m)
    return StepWeights(
        q_right.contiguous(), p["mogrifier_q_left"].contiguous(), p.get("mogrifier_q_bias"),
        r_right.contiguous() if nr else empty, p["mogrifier_r_left"].contiguous() if nr else q_right.new_empty(0, n, k),
        p.get("mogrifier_r_bias") if nr else None, zigzag)


@dataclass
class StepChains:
    """One step's slots of the window's chain buffers: ``x0`` x^0 ``[B, m]``, ``h0`` h~ ``[B, n]``, ``xc``
    x^1 .. x^(nq-1) ``[nq-1, B, m]``, ``hc`` h^1 .. h^(nr-1) ``[nr-1, B, n]``, ``xh`` ``[B, m+n]``
    (x^nq, h^nr: the gate product's input), and each round's gate: ``sgx`` ``[nq, B, m]``, ``sgh``
    ``[nr, B, n]``."""

    x0: Tensor
    h0: Tensor
    xc: Tensor
    hc: Tensor
    xh: Tensor
    sgx: Tensor
    sgh: Tensor

    def chain(self, name: str, index: int) -> Tensor:
        m = self.x0.shape[1]
        last = self.sgx.shape[0] if name == "x" else self.sgh.shape[0]
        if index == 0:
            return self.x0 if name == "x" else self.h0
        if index == last:
            return self.xh[:, :m] if name == "x" else self.xh[:, m:]
        return (self.xc if name == "x" else self.hc)[index - 1]

    def gate(self, name: str, j: int) -> Tensor:
        return (self.sgx if name == "x" else self.sgh)[j]


class TorchStepRounds:
    """The rounds of a step as a loop of :class:`~.triton_rounds.TorchRounds` (the kernels' twin)."""

    name = "torch"

    @staticmethod
    def forward(w: StepWeights, ch: StepChains, low: Tensor | None) -> None:
        """Fill the chains and gates of ``ch``; ``low`` ``[r, B, k]`` receives each round's ``low``."""
        for i in range(1, w.rounds + 1):
            target, j, right, left, bias = w.round(i)
            src = ch.chain("h" if target == "x" else "x", w.source_index(i))
            got = TorchRounds.forward(src, right, left, bias, ch.chain(target, j), ch.gate(target, j),
                                      ch.chain(target, j + 1))
            if low is not None:
                low[i - 1].copy_(got)

    @staticmethod
    def backward(w: StepWeights, ch: StepChains, dxh: Tensor, dpx: Tensor, dph: Tensor, dlow: Tensor,
                 dx: Tensor, dh: Tensor, mask: Tensor | None) -> None:
        """From ``dxh`` = dL/d[x^nq; h^nr] ``[B, m+n]`` (overwritten), write each round's ``dp`` into ``dpx``
        ``[nq, B, m]`` / ``dph`` ``[nr, B, n]`` and ``dlow`` ``[r, B, k]``, dL/dx^0 into ``dx`` and dL/dh~
        (times ``mask``) into ``dh``."""
        m = ch.x0.shape[1]
        grad = {"x": dxh[:, :m], "h": dxh[:, m:]}  # the gradient of each chain's current end
        extra = {"x": None, "h": None}  # no zigzag: the gradient reaching x^0 / h~ as a round's source
        for i in range(w.rounds, 0, -1):
            target, j, right, left, _ = w.round(i)
            source = "h" if target == "x" else "x"
            dp = (dpx if target == "x" else dph)[j]
            dold, dl, ds = TorchRounds.backward(grad[target], ch.chain(target, j), ch.gate(target, j), dp, left,
                                                right, grad[source] if w.zigzag else extra[source])
            grad[target] = dold
            dlow[i - 1].copy_(dl)
            if w.zigzag:
                grad[source] = ds
            else:
                extra[source] = ds
        for name, out in (("x", dx), ("h", dh)):
            total = grad[name] if extra[name] is None else grad[name] + extra[name]
            if name == "h" and mask is not None:
                total = total * mask
            out.copy_(total)


def step_rounds_for(t: Tensor, spec) -> type | None:
    """:class:`TritonStepRounds` when ``MOGLM_TRITON_ROUNDS=step``, for a low-rank float32 window on CUDA (or
    anywhere under ``TRITON_INTERPRET=1``) with Triton installed; else ``None`` (the per-round path:
    cuBLAS products and pointwise kernels, or with ``MOGLM_TRITON_ROUNDS=1`` a kernel per round)."""
    if (os.environ.get("MOGLM_TRITON_ROUNDS", "0") == "step" and spec.rank > 0 and spec.rounds > 0
            and t.dtype == torch.float32 and (t.is_cuda or interpreting()) and triton_missing() is None
            and product_dtype() in (None, torch.bfloat16, torch.float16)):
        return TritonStepRounds
    return None


# The kernels, as plain functions that _kernels() hands to triton.jit on first use (see triton_pointwise).
# ``i`` runs over a static range, so every round's chain, weights and widths are chosen at compile time.

def step_forward_kernel(x0, x0s, h0, h0s, xc, xcc, hc, hcc, xh, xhs, sgx, sgxc, sgh, sghc, low, lowc,
                        qr, ql, qb, rr, rl, rb, B, m, n, k,
                        R: tl.constexpr, NQ: tl.constexpr, NR: tl.constexpr, ZIGZAG: tl.constexpr,
                        HAS_BIAS: tl.constexpr, SAVE_LOW: tl.constexpr, PREC: tl.constexpr, LOW: tl.constexpr,
                        KP: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    rok = rows < B
    kk = tl.arange(0, KP)
    kok = kk < k
    for i in tl.static_range(1, R + 1):
        if i % 2 == 1:  # x^(j+1) = sigmoid(Q_j h^s) x^j
            j = (i - 1) // 2
            n_in, n_out = n, m
            right, left, bias, sg = qr + j * k * n, ql + j * m * k, qb + j * m, sgx + j * sgxc
            if j == 0:
                old, olds = x0, x0s
            else:
                old, olds = xc + (j - 1) * xcc, m
            if j + 1 == NQ:
                new, news = xh, xhs
            else:
                new, news = xc + j * xcc, m
            if ZIGZAG:
                s = j
            else:
                s = 0
            if s == 0:
                src, srcs = h0, h0s
            elif s == NR:
                src, srcs = xh + m, xhs
            else:
                src, srcs = hc + (s - 1) * hcc, n
        else:  # h^(j+1) = sigmoid(R_j x^s) h^j
            j = i // 2 - 1
            n_in, n_out = m, n
            right, left, bias, sg = rr + j * k * m, rl + j * n * k, rb + j * n, sgh + j * sghc
            if j == 0:
                old, olds = h0, h0s
            else:
                old, olds = hc + (j - 1) * hcc, n
            if j + 1 == NR:
                new, news = xh + m, xhs
            else:
                new, news = hc + j * hcc, n
            if ZIGZAG:
                s = j + 1
            else:
                s = 0
            if s == 0:
                src, srcs = x0, x0s
            elif s == NQ:
                src, srcs = xh, xhs
            else:
                src, srcs = xc + (s - 1) * xcc, m
        acc = tl.full((BLOCK_B, KP), 0.0, tl.float32)  # low [BLOCK_B, k]
        for c in range(0, n_in, BLOCK_C):
            ci = c + tl.arange(0, BLOCK_C)
            iok = ci < n_in
            a = tl.load(src + rows[:, None] * srcs + ci[None, :], mask=rok[:, None] & iok[None, :], other=0.0)
            w = tl.load(right + kk[None, :] * n_in + ci[:, None], mask=kok[None, :] & iok[:, None], other=0.0)
            if LOW == 1:
                a, w = a.to(tl.bfloat16), w.to(tl.bfloat16)
            elif LOW == 2:
                a, w = a.to(tl.float16), w.to(tl.float16)
            acc += tl.dot(a, w, input_precision=PREC)  # [BLOCK_B, KP]
        if SAVE_LOW:
            tl.store(low + (i - 1) * lowc + rows[:, None] * k + kk[None, :], acc, mask=rok[:, None] & kok[None, :])
        lhs = acc
        if LOW == 1:
            lhs = acc.to(tl.bfloat16)
        elif LOW == 2:
            lhs = acc.to(tl.float16)
        for c in range(0, n_out, BLOCK_C):
            co = c + tl.arange(0, BLOCK_C)
            ook = co < n_out
            wl = tl.load(left + co[None, :] * k + kk[:, None], mask=ook[None, :] & kok[:, None], other=0.0)
            if LOW == 1:
                wl = wl.to(tl.bfloat16)
            elif LOW == 2:
                wl = wl.to(tl.float16)
            pre = tl.dot(lhs, wl, input_precision=PREC)  # [BLOCK_B, BLOCK_C]
            if HAS_BIAS:
                pre += tl.load(bias + co, mask=ook, other=0.0)[None, :]
            gate = 1.0 / (1.0 + tl.exp(-pre))
            ok = rok[:, None] & ook[None, :]
            tl.store(sg + rows[:, None] * n_out + co[None, :], gate, mask=ok)
            o = tl.load(old + rows[:, None] * olds + co[None, :], mask=ok, other=0.0)
            tl.store(new + rows[:, None] * news + co[None, :], gate * o, mask=ok)
        tl.debug_barrier()  # the next round reads what this one wrote, from other threads of the program


def step_backward_kernel(g, gs, x0, x0s, h0, h0s, xc, xcc, hc, hcc, sgx, sgxc, sgh, sghc,
                         dpx, dpxc, dph, dphc, dlow, dlowc, ex, eh, dx, dxs, dh, dhs, mask, masks,
                         qr, ql, rr, rl, B, m, n, k,
                         R: tl.constexpr, NQ: tl.constexpr, NR: tl.constexpr, ZIGZAG: tl.constexpr,
                         HAS_MASK: tl.constexpr, PREC: tl.constexpr, LOW: tl.constexpr,
                         KP: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    rok = rows < B
    kk = tl.arange(0, KP)
    kok = kk < k
    for step in tl.static_range(0, R):
        i = R - step
        if i % 2 == 1:  # round i gated x from h
            j = (i - 1) // 2
            n_in, n_out = n, m
            right, left, dp, sg = qr + j * k * n, ql + j * m * k, dpx + j * dpxc, sgx + j * sgxc
            gt = g  # the running gradient of the target chain's end
            if j == 0:
                old, olds = x0, x0s
            else:
                old, olds = xc + (j - 1) * xcc, m
            if ZIGZAG:
                gsrc, gsrcs = g + m, gs
            else:
                gsrc, gsrcs = eh, n
        else:  # round i gated h from x
            j = i // 2 - 1
            n_in, n_out = m, n
            right, left, dp, sg = rr + j * k * m, rl + j * n * k, dph + j * dphc, sgh + j * sghc
            gt = g + m
            if j == 0:
                old, olds = h0, h0s
            else:
                old, olds = hc + (j - 1) * hcc, n
            if ZIGZAG:
                gsrc, gsrcs = g, gs
            else:
                gsrc, gsrcs = ex, m
        acc = tl.full((BLOCK_B, KP), 0.0, tl.float32)  # dlow [BLOCK_B, k]
        for c in range(0, n_out, BLOCK_C):
            co = c + tl.arange(0, BLOCK_C)
            ook = co < n_out
            ok = rok[:, None] & ook[None, :]
            d = tl.load(gt + rows[:, None] * gs + co[None, :], mask=ok, other=0.0)
            gate = tl.load(sg + rows[:, None] * n_out + co[None, :], mask=ok, other=0.0)
            o = tl.load(old + rows[:, None] * olds + co[None, :], mask=ok, other=0.0)
            dpc = d * o * gate * (1.0 - gate)  # [BLOCK_B, BLOCK_C]
            tl.store(dp + rows[:, None] * n_out + co[None, :], dpc, mask=ok)
            tl.store(gt + rows[:, None] * gs + co[None, :], d * gate, mask=ok)  # now dL/d old
            wl = tl.load(left + co[:, None] * k + kk[None, :], mask=ook[:, None] & kok[None, :], other=0.0)
            if LOW == 1:
                dpc, wl = dpc.to(tl.bfloat16), wl.to(tl.bfloat16)
            elif LOW == 2:
                dpc, wl = dpc.to(tl.float16), wl.to(tl.float16)
            acc += tl.dot(dpc, wl, input_precision=PREC)  # [BLOCK_B, KP]
        tl.store(dlow + (i - 1) * dlowc + rows[:, None] * k + kk[None, :], acc, mask=rok[:, None] & kok[None, :])
        lhs = acc
        if LOW == 1:
            lhs = acc.to(tl.bfloat16)
        elif LOW == 2:
            lhs = acc.to(tl.float16)
        for c in range(0, n_in, BLOCK_C):
            ci = c + tl.arange(0, BLOCK_C)
            iok = ci < n_in
            ok = rok[:, None] & iok[None, :]
            wr = tl.load(right + kk[:, None] * n_in + ci[None, :], mask=kok[:, None] & iok[None, :], other=0.0)
            if LOW == 1:
                wr = wr.to(tl.bfloat16)
            elif LOW == 2:
                wr = wr.to(tl.float16)
            ds = tl.dot(lhs, wr, input_precision=PREC)  # [BLOCK_B, BLOCK_C]
            if ZIGZAG or i < R - 1:  # the zigzag's running gradient, or a later round's sum so far
                ds += tl.load(gsrc + rows[:, None] * gsrcs + ci[None, :], mask=ok, other=0.0)
            tl.store(gsrc + rows[:, None] * gsrcs + ci[None, :], ds, mask=ok)
        tl.debug_barrier()  # the next round reads these gradients from other threads of the program
    for c in range(0, m, BLOCK_C):  # dL/dx^0
        ci = c + tl.arange(0, BLOCK_C)
        ok = rok[:, None] & (ci < m)[None, :]
        d = tl.load(g + rows[:, None] * gs + ci[None, :], mask=ok, other=0.0)
        if not ZIGZAG and R >= 2:
            d += tl.load(ex + rows[:, None] * m + ci[None, :], mask=ok, other=0.0)
        tl.store(dx + rows[:, None] * dxs + ci[None, :], d, mask=ok)
    for c in range(0, n, BLOCK_C):  # dL/dh~, through the state-dropout mask
        ci = c + tl.arange(0, BLOCK_C)
        ok = rok[:, None] & (ci < n)[None, :]
        d = tl.load(g + m + rows[:, None] * gs + ci[None, :], mask=ok, other=0.0)
        if not ZIGZAG:
            d += tl.load(eh + rows[:, None] * n + ci[None, :], mask=ok, other=0.0)
        if HAS_MASK:
            d *= tl.load(mask + rows[:, None] * masks + ci[None, :], mask=ok, other=0.0)
        tl.store(dh + rows[:, None] * dhs + ci[None, :], d, mask=ok)


@functools.cache
def _kernels(interpret: bool):
    del interpret  # the cache key only (see triton_pointwise._kernels)
    import triton

    return triton.jit(step_forward_kernel), triton.jit(step_backward_kernel)


def _stacked(t: Tensor, like: Tensor) -> tuple[Tensor, int]:
    """A ``[count, B, width]`` slot with contiguous ``[B, width]`` blocks: (base, stride between blocks);
    an empty one is passed as ``like`` (never read)."""
    if t.shape[0] == 0:
        return like, 0
    if t.stride(2) != 1 and t.shape[2] > 1 or t.stride(1) != t.shape[2]:
        raise ValueError(f"the step-round kernels need stacked [count, B, width] blocks with contiguous rows, got "
                         f"shape {tuple(t.shape)} strides {t.stride()}")
    return t, t.stride(0)


def _launch_constants(w: StepWeights, B: int, k: int) -> tuple[tuple[int], dict]:
    import triton

    low = {None: 0, torch.bfloat16: 1, torch.float16: 2}[product_dtype()]
    precision = dot_precision() if low == 0 else "ieee"  # bf16/fp16 operands: their own products
    nq, nr = w.q_right.shape[0], w.r_right.shape[0]
    constants = dict(R=nq + nr, NQ=nq, NR=nr, ZIGZAG=w.zigzag, PREC=precision, LOW=low,
                     KP=max(16, triton.next_power_of_2(k)), **CONFIG)
    return (triton.cdiv(B, CONFIG["BLOCK_B"]),), constants


class TritonStepRounds:
    """The rounds of a step as one Triton kernel each way (same contracts as :class:`TorchStepRounds`)."""

    name = "triton-step"

    @staticmethod
    def forward(w: StepWeights, ch: StepChains, low: Tensor | None) -> None:
        B, m = ch.x0.shape
        n, k = ch.h0.shape[1], w.q_left.shape[2]
        if not B:
            return
        grid, constants = _launch_constants(w, B, k)
        xc, xcc = _stacked(ch.xc, ch.xh)
        hc, hcc = _stacked(ch.hc, ch.xh)
        sgx, sgxc = _stacked(ch.sgx, ch.xh)
        sgh, sghc = _stacked(ch.sgh, ch.xh)
        lows, lowc = _stacked(low, ch.xh) if low is not None else (ch.xh, 0)
        has_bias = w.q_bias is not None
        _kernels(interpreting())[0][grid](
            ch.x0, row_stride(ch.x0), ch.h0, row_stride(ch.h0), xc, xcc, hc, hcc, ch.xh, row_stride(ch.xh),
            sgx, sgxc, sgh, sghc,
            lows, lowc, w.q_right, w.q_left, w.q_bias if has_bias else w.q_left,
            w.r_right if w.r_right.numel() else w.q_right, w.r_left if w.r_left.numel() else w.q_left,
            w.r_bias if w.r_bias is not None else w.q_left, B, m, n, k,
            HAS_BIAS=has_bias, SAVE_LOW=low is not None, **constants)

    @staticmethod
    def backward(w: StepWeights, ch: StepChains, dxh: Tensor, dpx: Tensor, dph: Tensor, dlow: Tensor,
                 dx: Tensor, dh: Tensor, mask: Tensor | None) -> None:
        B, m = ch.x0.shape
        n, k = ch.h0.shape[1], w.q_left.shape[2]
        if not B:
            return
        grid, constants = _launch_constants(w, B, k)
        xc, xcc = _stacked(ch.xc, dxh)
        hc, hcc = _stacked(ch.hc, dxh)
        sgx, sgxc = _stacked(ch.sgx, dxh)
        sgh, sghc = _stacked(ch.sgh, dxh)
        dpx_, dpxc = _stacked(dpx, dxh)
        dph_, dphc = _stacked(dph, dxh)
        dlow_, dlowc = _stacked(dlow, dxh)
        extra_x = extra_h = dxh
        if not w.zigzag:  # the sources' sums, written by the last round that reads each
            extra_x, extra_h = dxh.new_empty(B, m), dxh.new_empty(B, n)
        _kernels(interpreting())[1][grid](
            dxh, row_stride(dxh), ch.x0, row_stride(ch.x0), ch.h0, row_stride(ch.h0), xc, xcc, hc, hcc,
            sgx, sgxc, sgh, sghc,
            dpx_, dpxc, dph_, dphc, dlow_, dlowc, extra_x, extra_h, dx, row_stride(dx), dh, row_stride(dh),
            mask if mask is not None else dh, row_stride(mask) if mask is not None else 0,
            w.q_right, w.q_left, w.r_right if w.r_right.numel() else w.q_right,
            w.r_left if w.r_left.numel() else w.q_left, B, m, n, k, HAS_MASK=mask is not None, **constants)
