"""Matrix products of the fused recurrences: oneDNN's fp32 GEMM on CPU, ``torch.mm`` everywhere else.

Why: on CPU, ``torch.mm`` runs MKL's sgemm, while ``torch.nn.LSTM`` runs oneDNN's RNN primitive. On the
AVX-512 machine this was written on, oneDNN's GEMMs are about 2x faster than MKL's (measured 350-430
GFLOP/s against 165-200 at the shapes of an H=650 LSTM; see docs/fused-recurrence.md). A fused recurrence
built on ``torch.mm`` therefore cannot match ``nn.LSTM`` there, whatever else it does. PyTorch exposes
oneDNN's matmul on dense tensors through the ops Inductor uses for CPU linear layers:
``torch.ops.mkldnn._reorder_linear_weight`` (the weight, reordered once into oneDNN's blocked layout) and
``torch.ops.mkldnn._linear_pointwise`` (``x @ w.T + b``, with a fused ``+ other`` in its ``binary``
overload). They are private, so they are used only for float32 CPU tensors, only after a one-time probe
has checked them against ``torch.mm``, and never on strided inputs (oneDNN is ~100x slower on those, so
inputs are made contiguous first). Anything else (CUDA, float64, a torch without these ops) uses
``torch.mm``/``torch.addmm``, which is the right call on CUDA (cuBLAS) anyway.

Set ``moglm.recurrence.gemm.ONEDNN = False`` to force ``torch.mm`` (benchmarks, debugging).

Under autocast (bf16 or fp16) the fused windows keep their states, cell arithmetic and results in float32
and run only the products in the low precision, inside :func:`low_precision_products`: operands are cast
down, cuBLAS accumulates in float32, and the product comes back as float32 (rounded to the low precision
on the way, as autocast's own products are).
"""

from __future__ import annotations

import contextlib
import contextvars
import warnings

import torch
from torch import Tensor

#: use oneDNN's matmul for float32 CPU tensors when the probe succeeds (set False to force torch.mm).
ONEDNN = True

#: rows per call when a big [rows, K] @ [K, N] product is split (oneDNN is fastest at a few hundred rows).
CHUNK_ROWS = 512

_probe_result: bool | None = None

#: the dtype products run in inside :func:`low_precision_products` (``None``: the operands' own)
_low: contextvars.ContextVar[torch.dtype | None] = contextvars.ContextVar("moglm_low_precision", default=None)


@contextlib.contextmanager
def low_precision_products(dtype: torch.dtype | None):
    """Products of float32 operands made in ``dtype`` (bf16/fp16) with float32 results; ``None``: unchanged."""
    token = _low.set(dtype)
    try:
        yield
    finally:
        _low.reset(token)


def product_dtype() -> torch.dtype | None:
    """The low precision products run in now, or ``None``."""
    return _low.get()


def _mm(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b``, in the low precision when one is set (float32 result)."""
    low = _low.get()
    if low is None or a.dtype != torch.float32:
        return torch.mm(a, b)
    return torch.mm(a.to(low), b.to(low)).float()


def _onednn_ops_work() -> bool:
    """One-time check that the private oneDNN ops exist and agree with ``torch.mm`` (outside autocast, whose
    lower-precision ``addmm`` would fail the check and switch oneDNN off for the rest of the process)."""
    global _probe_result
    if _probe_result is None:
        try:
            with torch.autocast("cpu", enabled=False):
                ok = _onednn_ops_agree()
        except Exception as error:  # pragma: no cover - depends on the torch build
            ok = False
            warnings.warn(f"moglm: oneDNN matmul unavailable ({error!r}); the fused recurrences use torch.mm")
        _probe_result = bool(ok)
    return _probe_result


def _onednn_ops_agree() -> bool:
    ops = torch.ops.mkldnn
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 7, generator=gen)
    w = torch.randn(3, 7, generator=gen)
    b = torch.randn(3, generator=gen)
    other = torch.randn(5, 3, generator=gen)
    packed = ops._reorder_linear_weight(w, 5)
    y = ops._linear_pointwise(x, packed, b, "none", [], "")
    z = ops._linear_pointwise.binary(x, other, packed, None, "add")
    return torch.allclose(y, torch.addmm(b, x, w.t()), atol=1e-4) and torch.allclose(
        z, torch.addmm(other, x, w.t()), atol=1e-4)


def use_onednn(t: Tensor) -> bool:
    """Whether products involving ``t`` run on oneDNN (float32 CPU tensors, oneDNN enabled and working)."""
    return (
        ONEDNN
        and t.device.type == "cpu"
        and t.dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and torch.backends.mkldnn.enabled
        and _onednn_ops_work()
    )


class Linear:
    """``x @ weight.T (+ bias) (+ other)`` for a ``weight`` ``[N, K]`` reused over many calls.

    On the oneDNN path the weight is reordered once (``rows`` is the expected row count of ``x``, a
    layout hint); elsewhere it is kept as a transposed view for ``torch.mm``.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None = None, rows: int = 64) -> None:
        self.low = _low.get() if weight.dtype == torch.float32 else None
        self.onednn = use_onednn(weight) and self.low is None
        self.bias = bias
        self.out_features = weight.shape[0]
        if self.onednn:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), max(int(rows), 1))
            self._op, self._op_add = torch.ops.mkldnn._linear_pointwise.default, torch.ops.mkldnn._linear_pointwise.binary
        else:
            self.weight_t = weight.t() if self.low is None else weight.to(self.low).t()  # [K, N]

    def __call__(self, x: Tensor, add: Tensor | None = None) -> Tensor:
        """``x`` ``[M, K]`` -> ``[M, N]`` (a new tensor); ``add`` ``[M, N]`` is added to the product."""
        if self.onednn:
            if add is None:
                return self._op(x.contiguous(), self.packed, self.bias, "none", [], "")
            return self._op_add(x.contiguous(), add.contiguous(), self.packed, self.bias, "add")
        if self.low is not None:  # low-precision product, float32 sums
            y = torch.mm(x.to(self.low), self.weight_t).float()
            if add is not None:
                y.add_(add)
            return y if self.bias is None else y.add_(self.bias)
        if add is None:
            if self.bias is None:
                return torch.mm(x, self.weight_t)
            return torch.addmm(self.bias, x, self.weight_t)
        y = torch.addmm(add, x, self.weight_t)
        return y if self.bias is None else y.add_(self.bias)

    def rows(self, x: Tensor, out: Tensor | None = None) -> Tensor:
        """``x`` ``[R, K]`` with many rows -> ``[R, N]``, in chunks of :data:`CHUNK_ROWS` rows on oneDNN."""
        if not self.onednn:
            if out is None or self.low is not None:
                return self(x) if out is None else out.copy_(self(x))
            if self.bias is None:
                return torch.mm(x, self.weight_t, out=out)
            return torch.addmm(self.bias, x, self.weight_t, out=out)
        if out is None:
            out = x.new_empty(x.shape[0], self.out_features)
        for start in range(0, x.shape[0], CHUNK_ROWS):
            out[start : start + CHUNK_ROWS] = self(x[start : start + CHUNK_ROWS])
        return out


def transpose_contiguous(x: Tensor, rows_per_copy: int = CHUNK_ROWS) -> Tensor:
    """``x.t().contiguous()`` for a big ``[R, N]`` matrix, copied in row blocks (a plain transposed copy
    of tens of MB is several times slower: it leaves the caches for every element)."""
    out = x.new_empty(x.shape[1], x.shape[0])  # [N, R]
    for start in range(0, x.shape[0], rows_per_copy):
        out[:, start : start + rows_per_copy].copy_(x[start : start + rows_per_copy].t())
    return out


def matmul_tn(a: Tensor, *bs: Tensor) -> Tensor | list[Tensor]:
    """``a.T @ b`` for ``a`` ``[R, N]`` and each ``b`` ``[R, K]`` with many rows R (weight gradients over
    T*B rows); one result, or a list for several ``b``.

    oneDNN wants the contracted dimension contiguous in both operands, so on that path the operands are
    transposed first (``a`` once for all ``b``; cheap next to the products for the big LSTM matrices).
    Small products use torch.mm, which takes the transposes as strides.
    """
    if _low.get() is None and use_onednn(a) and a.shape[1] >= 256 and all(b.shape[1] >= 256 for b in bs):
        at = transpose_contiguous(a)  # [N, R]
        outs = [torch.ops.mkldnn._linear_pointwise(at, transpose_contiguous(b), None, "none", [], "") for b in bs]
    else:
        outs = [_mm(a.t(), b) for b in bs]
    return outs[0] if len(bs) == 1 else outs
