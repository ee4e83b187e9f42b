"""CUDA graphs for fused windows: capture a layer's forward and backward loops once per shape, then replay
each window with one launch.

A fused window on a GPU launches, per step, one GEMM per Mogrifier round, one for the gates and one Triton
kernel per pointwise stage (:mod:`moglm.recurrence.triton_pointwise`); at H = 650 and B = 64 each kernel
runs for microseconds, so the launches themselves bound the speed. A CUDA graph records the whole
window's launches once and replays them as one.

How:

* The training path (grad enabled) is :func:`torch.cuda.make_graphed_callables` over the fused autograd
  Function: it captures the forward and the backward, each replayed as one graph, with inputs copied into
  the graph's static buffers.
* The forward-only path (evaluation, no grad) is one :class:`torch.cuda.CUDAGraph` of the window with
  reused buffers.
* Graphs are keyed by the layer (its ``id``: two layers of the same shape must not share output buffers,
  since the first's outputs are still needed when the second replays), the window's shape and dtype, the
  parameters' storage (an optimizer's in-place update is seen by a replay; a new tensor is not), whether
  there is a state-dropout mask, and which inputs require grad. A new key captures again; the cache keeps
  :data:`MAX_GRAPHS` graphs and drops the oldest.
* Outputs of a replay live in the graph's buffers until the same layer's next replay, as in any
  CUDA-graphed training loop: a window's loss must be backpropagated before the layer's next window.

Graphs are off by default (:func:`enable` turns them on, :func:`graphs` for a block; ``moglm bench
throughput --device cuda`` measures both ways). Capture needs a CUDA device: both refuse anywhere else
with one clear line.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict

import torch
from torch import Tensor

from .gemm import product_dtype

#: graphed windows kept (each holds its own buffers and memory pool)
MAX_GRAPHS = 32

_enabled = False
_cache: OrderedDict = OrderedDict()


def unavailable() -> str | None:
    """Why CUDA graphs cannot be captured here (``None`` if they can)."""
    if not torch.cuda.is_available():
        return "CUDA graphs need a CUDA device, and torch sees none here"
    return None


def enable(on: bool = True) -> None:
    """Turn graph capture of fused CUDA windows on (or off, which also frees the captured graphs)."""
    global _enabled
    if on and (reason := unavailable()) is not None:
        raise RuntimeError(reason)
    _enabled = on
    if not on:
        _cache.clear()


def enabled() -> bool:
    return _enabled


@contextlib.contextmanager
def graphs(on: bool = True):
    """Graph capture on (or off) inside the block only; what was captured stays cached for the next block."""
    global _enabled
    if on and (reason := unavailable()) is not None:
        raise RuntimeError(reason)
    before, _enabled = _enabled, on
    try:
        yield
    finally:
        _enabled = before


def applies(xs: Tensor) -> bool:
    """Whether a window on ``xs`` runs graphed: graphs enabled, a CUDA tensor, and not inside a capture."""
    return _enabled and xs.is_cuda and not torch.cuda.is_current_stream_capturing()


def graph_key(cell, xs: Tensor, h0: Tensor, c0: Tensor, mask: Tensor | None, params: tuple[Tensor, ...],
              grad: bool) -> tuple:
    """What a captured window depends on, the precision of its products included (autocast's dtype, and
    whether cuBLAS may run float32 products as TF32: a captured graph keeps the kernels chosen at capture);
    any change means a new capture (see the module docstring)."""
    return (id(cell), grad, tuple(xs.shape), tuple(h0.shape), xs.dtype, xs.device, product_dtype(),
            torch.backends.cuda.matmul.allow_tf32,
            mask is not None, tuple(t.requires_grad for t in (xs, h0, c0)),
            tuple((p.data_ptr(), p.requires_grad) for p in params))


def _remember(key: tuple, value):
    _cache[key] = value
    while len(_cache) > MAX_GRAPHS:
        _cache.popitem(last=False)
    return value


def _static_like(t: Tensor) -> Tensor:
    return t.detach().clone().requires_grad_(t.requires_grad)


def graphed_training_window(function, spec, cell, xs: Tensor, h0: Tensor, c0: Tensor, mask: Tensor | None,
                            params: tuple[Tensor, ...]) -> tuple[Tensor, Tensor, Tensor]:
    """``function.apply(spec, cell, xs, h0, c0, mask, *params)`` as a replayed graph (forward and backward)."""
    key = graph_key(cell, xs, h0, c0, mask, params, grad=True)
    graphed = _cache.get(key)
    if graphed is None:
        if mask is None:
            def window(xs, h0, c0, *params):
                return function.apply(spec, cell, xs, h0, c0, None, *params)
        else:
            def window(xs, h0, c0, mask, *params):
                return function.apply(spec, cell, xs, h0, c0, mask, *params)
        inputs = [_static_like(t) for t in (xs, h0, c0, mask) if t is not None]
        graphed = _remember(key, torch.cuda.make_graphed_callables(window, (*inputs, *params)))  # params: as they are
    else:
        _cache.move_to_end(key)
    own = _OwnGrads.apply(*params)  # the parameters themselves (same storage: no copy into the graph)
    args = (xs, h0, c0, *own) if mask is None else (xs, h0, c0, mask, *own)
    return graphed(*args)


class _OwnGrads(torch.autograd.Function):
    """Identity on the parameters whose backward clones their gradients: a graphed backward returns its
    static buffers, which ``.grad`` would otherwise take over and the next replay overwrite (two parameters
    could even share one)."""

    @staticmethod
    def forward(ctx, *params):
        return tuple(p.view_as(p) for p in params)

    @staticmethod
    def backward(ctx, *grads):
        return tuple(None if g is None else g.clone() for g in grads)


def graphed_forward_window(forward_impl, spec, cell, xs: Tensor, h0: Tensor, c0: Tensor, mask: Tensor | None,
                           params: dict) -> tuple[Tensor, Tensor, Tensor]:
    """``forward_impl(spec, xs, h0, c0, mask, params, save=False)`` (no grad) as one replayed graph."""
    key = graph_key(cell, xs, h0, c0, mask, tuple(params.values()), grad=False)
    entry = _cache.get(key)
    if entry is None:
        inputs = [t.detach().clone() for t in (xs, h0, c0)] + ([mask.detach().clone()] if mask is not None else [])
        static_mask = inputs[3] if mask is not None else None

        def run():
            return forward_impl(spec, *inputs[:3], static_mask, params, save=False)[:3]

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up outside the capture (allocations, cuBLAS handles, Triton JIT)
            run()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = run()
        entry = _remember(key, (graph, inputs, outputs))
    else:
        _cache.move_to_end(key)
    graph, inputs, outputs = entry
    for static, new in zip(inputs, (xs, h0, c0, mask)):
        static.copy_(new)
    graph.replay()
    return outputs
