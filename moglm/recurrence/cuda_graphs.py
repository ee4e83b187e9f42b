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
* A training window's outputs live in the graph's buffers until the same layer's next replay, as in any
  CUDA-graphed training loop: a window's loss must be backpropagated before the layer's next window. A
  forward-only window returns copies, so evaluation may keep a window's outputs (the temperature search keeps
  every window's features).

Who turns them on: in this module graphs are off (:func:`enable` turns them on, :func:`graphs` for a block;
both refuse in one line where torch sees no CUDA device). The commands decide with :func:`resolve`:
``train.cuda_graphs``, and ``--cuda-graphs/--no-cuda-graphs`` of ``moglm evaluate`` and ``moglm dyneval``, are
``null``/unset by default: on where one CUDA device runs, off on CPU and for data-parallel training.

Where graphs cannot work they turn themselves off with one line (the caller's ``log``, given to :func:`graphs`;
a warning without one), and no work is lost:

* a failed capture (an exception while capturing, e.g. ``cudaErrorStreamCaptureInvalidated``): the stream is
  made current again and synchronized, the half-made graph dropped, graphs are off for the rest of the process
  (``enable(False)`` forgets that), and the window runs ungraphed. Graphs asked for explicitly (``true``) fall
  back the same way, and the line says they were asked for: a run that asked for speed still finishes.
  (``graphs(strict=True)``, what the benchmarks of graphed windows use, raises instead.)
* windows that keep changing (episodes of varying length, parameters replaced every step): a layer captures at
  most :data:`MAX_WINDOWS_PER_LAYER` different windows; windows of any other shape run ungraphed, its captured
  ones still replay. Said once per process.

``moglm bench throughput --device cuda`` measures graphed and plain windows side by side.
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable

import torch
from torch import Tensor

from ..errors import MoglmError
from .fallback import user_stacklevel
from .gemm import product_dtype

#: graphed windows kept (each holds its own buffers and memory pool)
MAX_GRAPHS = 32
#: different windows (shape, dtype, mask, parameters) one layer captures at most. A language model's layer meets
#: a handful in a whole run (the training window, each evaluation's batch size and each split's shorter last
#: window, MC dropout's masks); more means shapes that keep changing, where capturing costs more than it saves.
MAX_WINDOWS_PER_LAYER = 8

_enabled = False
_cache: OrderedDict = OrderedDict()
_failed: str | None = None  # the capture error that turned graphs off for the rest of the process
_windows: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # layer (its cell) -> the keys it captured
_said_too_many = False  # the line about a layer past MAX_WINDOWS_PER_LAYER was said
_log: Callable[[str], None] | None = None  # where the line saying graphs turned themselves off goes
_asked = False  # graphs were asked for explicitly (that line says so)
_strict = False  # a fallback raises instead (a benchmark of graphs must not time plain windows)


def unavailable() -> str | None:
    """Why CUDA graphs cannot be captured here (``None`` if they can)."""
    if not torch.cuda.is_available():
        return "CUDA graphs need a CUDA device, and torch sees none here"
    return None


def resolve(setting: bool | None, device: torch.device | str, distributed: bool = False,
            name: str = "cuda_graphs") -> tuple[bool, str | None]:
    """Whether fused windows on ``device`` run as CUDA graphs under ``setting`` (the option called ``name``),
    and the one line to log about it (``None``: nothing to say).

    ``None`` (auto): on where one CUDA device runs; off on CPU, where graphs never apply, without a word; off
    for data-parallel training (``distributed``) with a line. ``True``: on, and a one-line
    :class:`~moglm.errors.MoglmError` where they cannot run. ``False``: off."""
    device = torch.device(device)
    possible = device.type == "cuda" and not distributed
    if setting is True and not possible:
        raise MoglmError(f"{name} needs one CUDA device (CUDA graphs are not supported on CPU or with data-parallel "
                         f"training; the device here is {device})")
    if setting is None and device.type == "cuda" and distributed:
        return False, (f"CUDA graphs are off: data-parallel training does not support them ({name} = false "
                       "leaves out this line)")
    return (possible if setting is None else setting), None


def enable(on: bool = True) -> None:
    """Turn graph capture of fused CUDA windows on; or off, which also frees the captured graphs and forgets a
    failed capture and each layer's count of windows."""
    global _enabled, _failed, _said_too_many
    if on and (reason := unavailable()) is not None:
        raise RuntimeError(reason)
    _enabled = on
    if not on:
        _cache.clear()
        _windows.clear()
        _failed, _said_too_many = None, False


def enabled() -> bool:
    return _enabled


@contextlib.contextmanager
def graphs(on: bool = True, *, log: Callable[[str], None] | None = None, asked: bool = False,
           strict: bool = False):
    """Graph capture on (or off) inside the block only; what was captured stays cached for the next block.
    ``log`` prints the line saying graphs turned themselves off inside the block (default: a warning), which
    says too whether they were ``asked`` for explicitly (a setting of ``true``, not auto). ``strict``: where a
    window would fall back, ``RuntimeError`` instead, and graphs stay on for the next try (benchmarks of graphs)."""
    global _enabled, _log, _asked, _strict
    if on and (reason := unavailable()) is not None:
        raise RuntimeError(reason)
    before = _enabled, _log, _asked, _strict
    _enabled, _log, _asked, _strict = on, log, asked, strict
    try:
        yield
    finally:
        _enabled, _log, _asked, _strict = before


def where_possible(setting: bool | None, device: torch.device | str, log: Callable[[str], None],
                   name: str = "cuda_graphs"):
    """A context running the block with graphs as :func:`resolve` decides for ``setting`` on ``device`` (one
    process), their lines going to ``log``: what ``moglm evaluate`` and ``moglm dyneval`` run in."""
    on, line = resolve(setting, device, name=name)
    if line is not None:
        log(line)
    return graphs(log=log, asked=bool(setting)) if on else contextlib.nullcontext()


def applies(xs: Tensor) -> bool:
    """Whether a window on ``xs`` runs graphed: graphs enabled (and not turned off by a failed capture), a CUDA
    tensor, and not inside a capture."""
    return _enabled and _failed is None and xs.is_cuda and not torch.cuda.is_current_stream_capturing()


def _say(line: str) -> None:
    if _log is not None:
        _log(line)
    else:
        warnings.warn(f"moglm: {line}", RuntimeWarning, stacklevel=user_stacklevel())


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


def _graph_for(key: tuple, cell, capture: Callable[[], object]):
    """The graph of the window ``key`` of the layer ``cell``: cached, or captured now by ``capture()``;
    ``None`` where the window runs ungraphed instead (a capture failed, now or earlier in this process; or
    the layer holds :data:`MAX_WINDOWS_PER_LAYER` other windows already)."""
    global _said_too_many
    entry = _cache.get(key)
    if entry is not None:
        _cache.move_to_end(key)
        return entry
    if _failed is not None:
        return None
    captured = _windows.setdefault(cell, set())
    if key not in captured and len(captured) >= MAX_WINDOWS_PER_LAYER:
        line = (f"CUDA graphs: a layer met more than {MAX_WINDOWS_PER_LAYER} different windows (shapes that keep "
                f"changing); each layer replays the {MAX_WINDOWS_PER_LAYER} it captured and runs any other window "
                "ungraphed")
        if _strict:
            raise RuntimeError(line)
        if not _said_too_many:
            _said_too_many = True
            _say(line)
        return None
    stream = torch.cuda.current_stream()
    try:
        entry = capture()
    except Exception as error:  # noqa: BLE001 - whatever stopped the capture, the window runs ungraphed
        _capture_failed(error, stream)
        return None
    captured.add(key)
    return _remember(key, entry)


def _capture_failed(error: Exception, stream) -> None:
    """After a failed capture: the stream usable again, graphs off for the rest of the process, one line."""
    global _failed
    torch.cuda.set_stream(stream)  # a capture failing inside torch.cuda.graph can leave its side stream current
    torch.cuda.synchronize()  # the queued work done (a device left broken raises here: nothing could run on it)
    _random_generator_out_of_capture()
    lines = str(error).strip().splitlines()
    reason = f"{type(error).__name__}: {lines[0][:200] if lines else 'no message'}"
    if _strict:
        raise RuntimeError(f"CUDA graphs: capturing a window failed ({reason})") from error
    _failed = reason
    _cache.clear()  # the half-made graph was never kept; windows in flight hold the graphs their backward needs
    asked = ", although they were asked for" if _asked else ""
    _say(f"CUDA graphs are off for the rest of this process{asked}: capturing a window failed ({_failed}); that "
         "window and every later one run ungraphed")


def _random_generator_out_of_capture() -> None:
    """A failed capture stops before the device's random generator leaves capture mode (the end of
    ``CUDAGraph.capture_end`` is never reached), and every later random draw on the device (a dropout mask, an
    initialisation) would raise "Offset increment outside graph capture encountered unexpectedly". The
    generator takes a copy of its own state instead: the same seed and offset, not marked as capturing."""
    generator = torch.cuda.default_generators[torch.cuda.current_device()]
    if hasattr(generator, "graphsafe_set_state"):  # torch >= 2.4 (earlier ones cannot be repaired from Python)
        generator.graphsafe_set_state(generator.clone_state())


def graphed_training_window(function, spec, cell, xs: Tensor, h0: Tensor, c0: Tensor, mask: Tensor | None,
                            params: tuple[Tensor, ...]) -> tuple[Tensor, Tensor, Tensor]:
    """``function.apply(spec, cell, xs, h0, c0, mask, *params)`` as a replayed graph (forward and backward),
    or run as it is where the window runs ungraphed (:func:`_graph_for`)."""

    def capture():
        if mask is None:
            def window(xs, h0, c0, *params):
                return function.apply(spec, cell, xs, h0, c0, None, *params)
        else:
            def window(xs, h0, c0, mask, *params):
                return function.apply(spec, cell, xs, h0, c0, mask, *params)
        inputs = [_static_like(t) for t in (xs, h0, c0, mask) if t is not None]
        return torch.cuda.make_graphed_callables(window, (*inputs, *params))  # params: as they are

    graphed = _graph_for(graph_key(cell, xs, h0, c0, mask, params, grad=True), cell, capture)
    if graphed is None:
        return function.apply(spec, cell, xs, h0, c0, mask, *params)
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
    """``forward_impl(spec, xs, h0, c0, mask, params, save=False)`` (no grad) as one replayed graph, or run as
    it is where the window runs ungraphed (:func:`_graph_for`). Returns copies of the graph's outputs."""

    def capture():
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
        return graph, inputs, outputs

    entry = _graph_for(graph_key(cell, xs, h0, c0, mask, tuple(params.values()), grad=False), cell, capture)
    if entry is None:
        return forward_impl(spec, xs, h0, c0, mask, params, save=False)[:3]
    graph, inputs, outputs = entry
    for static, new in zip(inputs, (xs, h0, c0, mask)):
        static.copy_(new)
    graph.replay()
    return tuple(t.clone() for t in outputs)  # the caller may keep them past this layer's next replay
