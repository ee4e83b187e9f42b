"""CUDA-graphed windows: what can be checked without a GPU (the device check, when graphs are on, the cache key,
that CPU windows never take the graph path, and the fallbacks: a failed capture, windows that keep changing,
driven on CPU tensors with the capture faked). Capture and replay themselves need CUDA
(``tests/recurrence/test_recurrence_cuda.py``, and ``moglm bench throughput --device cuda`` measures them)."""

from __future__ import annotations

import pytest
import torch

import moglm
from moglm.errors import MoglmError
from moglm.recurrence import cuda_graphs

from conftest import refuse_capture


@pytest.fixture(autouse=True)
def forget_graphs():
    yield
    cuda_graphs.enable(False)  # the cache, a failed capture and each layer's count of windows forgotten


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour of a machine without CUDA")
def test_enabling_graphs_without_cuda_is_refused_in_one_clear_line():
    with pytest.raises(RuntimeError, match="CUDA graphs need a CUDA device"):
        cuda_graphs.enable()
    with pytest.raises(RuntimeError, match="CUDA graphs need a CUDA device"):
        with cuda_graphs.graphs():
            pass
    assert not cuda_graphs.enabled()


def test_a_cpu_window_never_takes_the_graph_path_even_when_graphs_are_on(monkeypatch):
    monkeypatch.setattr(cuda_graphs, "_enabled", True)
    for name in ("graphed_training_window", "graphed_forward_window"):
        monkeypatch.setattr(cuda_graphs, name, lambda *a, **k: pytest.fail("graph path taken on CPU"))
    model = moglm.MogrifierLSTM(7, 5, 2, rounds=5, rank=2, backend="fused")
    x = torch.randn(4, 3, 7, requires_grad=True)
    y, _ = model(x)
    y.sum().backward()
    with torch.no_grad():
        model(x)
    assert x.grad is not None


def test_the_graph_key_separates_layers_shapes_and_replaced_parameters():
    a, b = moglm.LSTM(5, 5, 2), moglm.LSTM(5, 5, 2)
    cells = a.cells
    x, h = torch.zeros(4, 3, 5, requires_grad=True), torch.zeros(3, 5)
    params = tuple(a.layer_parameters(0).values())
    key = cuda_graphs.graph_key(cells[0], x, h, h, None, params, grad=True)
    assert key == cuda_graphs.graph_key(cells[0], x.detach().clone().requires_grad_(), h, h, None, params, grad=True)
    different = [
        cuda_graphs.graph_key(cells[1], x, h, h, None, params, grad=True),  # same shape, another layer
        cuda_graphs.graph_key(cells[0], torch.zeros(5, 3, 5, requires_grad=True), h, h, None, params, grad=True),
        cuda_graphs.graph_key(cells[0], x, h, h, torch.ones(3, 5), params, grad=True),  # a dropout mask
        cuda_graphs.graph_key(cells[0], x, h, h, None, params, grad=False),  # forward only
        cuda_graphs.graph_key(cells[0], x, h, h, None, tuple(b.layer_parameters(0).values()), grad=True),
    ]
    assert all(k != key for k in different) and len(set(different)) == len(different)


def test_the_graph_key_separates_the_precision_of_the_products():
    from moglm.recurrence.gemm import low_precision_products

    cell = moglm.LSTM(5, 5).cells[0]
    x, h = torch.zeros(4, 3, 5), torch.zeros(3, 5)
    plain = cuda_graphs.graph_key(cell, x, h, h, None, (), grad=True)
    with low_precision_products(torch.bfloat16):
        assert cuda_graphs.graph_key(cell, x, h, h, None, (), grad=True) != plain


def test_parameters_receive_gradients_of_their_own_not_a_graphs_buffers():
    """What a graphed backward hands back are its static buffers; the parameters' wrapper copies them."""
    a, b = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    va, vb = cuda_graphs._OwnGrads.apply(a, b)
    assert va.data_ptr() == a.data_ptr()  # no copy on the way in
    shared = torch.ones(3)  # one buffer for both, as a graph's output may be

    class Buffer(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            return x + y

        @staticmethod
        def backward(ctx, g):
            return shared, shared

    Buffer.apply(va, vb).sum().backward()
    assert torch.equal(a.grad, shared) and torch.equal(b.grad, shared)
    assert len({a.grad.data_ptr(), b.grad.data_ptr(), shared.data_ptr()}) == 3


@pytest.mark.parametrize("setting, device, distributed, on", [
    (None, "cuda", False, True), (None, "cuda:1", False, True),  # auto: one CUDA device
    (None, "cpu", False, False), (None, "cpu", True, False),  # auto on CPU: off, nothing to say
    (True, "cuda", False, True), (False, "cuda", False, False), (False, "cpu", False, False),
])
def test_auto_means_graphs_where_one_cuda_device_runs_and_says_nothing_on_cpu(setting, device, distributed, on):
    assert cuda_graphs.resolve(setting, device, distributed, "train.cuda_graphs") == (on, None)


def test_auto_turns_graphs_off_for_data_parallel_training_with_one_line():
    on, line = cuda_graphs.resolve(None, "cuda", True, "train.cuda_graphs")
    assert not on
    assert line == ("CUDA graphs are off: data-parallel training does not support them (train.cuda_graphs = false "
                    "leaves out this line)")


@pytest.mark.parametrize("device, distributed", [("cpu", False), ("cuda", True)])
def test_graphs_asked_for_where_they_cannot_run_are_refused_in_one_line(device, distributed):
    with pytest.raises(MoglmError, match=r"^train.cuda_graphs needs one CUDA device \(CUDA graphs are not supported on "
                       rf"CPU or with data-parallel training; the device here is {device}\)$"):
        cuda_graphs.resolve(True, device, distributed, "train.cuda_graphs")


def _train_window(model, x):
    """Outputs, final state and every gradient of one training window of ``model``."""
    model.zero_grad()
    x = x.detach().clone().requires_grad_()
    y, (h, c) = model(x)
    (y.sum() + h.sum() + c.sum()).backward()
    return [y.detach(), h.detach(), c.detach(), x.grad, *(p.grad.clone() for p in model.parameters())]


@pytest.mark.parametrize("asked", [False, True])
def test_a_failed_capture_runs_the_window_ungraphed_says_so_once_and_turns_graphs_off(fake_cuda, asked):
    model = moglm.MogrifierLSTM(7, 5, 2, rounds=3, rank=2, backend="fused")
    x = torch.randn(6, 3, 7)
    expected = _train_window(model, x)
    cuda = fake_cuda(refuse_capture)
    lines: list[str] = []
    with cuda_graphs.graphs(log=lines.append, asked=asked):
        got = [_train_window(model, x) for _ in range(2)]  # two windows, two layers: one capture tried
        with torch.no_grad():
            y, _ = model.eval()(x)  # a forward-only window: ungraphed too, no capture tried
    for window in got:
        for a, e in zip(window, expected):
            torch.testing.assert_close(a, e, rtol=0, atol=0)
    torch.testing.assert_close(y, model(x)[0], rtol=0, atol=0)
    assert cuda.captures == 1
    # the stream usable again, and the random generator out of capture mode
    assert cuda.calls == ["set_stream(the stream)", "synchronize", "random generator set to a copy of its state"]
    although = ", although they were asked for" if asked else ""
    assert lines == [f"CUDA graphs are off for the rest of this process{although}: capturing a window failed "
                     "(RuntimeError: CUDA error: operation not permitted when stream is capturing); that window and "
                     "every later one run ungraphed"]
    assert cuda_graphs._failed is not None and not cuda_graphs._cache
    cuda_graphs.enable(False)
    assert cuda_graphs._failed is None  # enable(False) forgets the failure


def test_a_failed_forward_only_capture_falls_back_the_same_way(fake_cuda, monkeypatch):
    model = moglm.LSTM(4, 5, 2, backend="fused").eval()
    x = torch.randn(6, 3, 4)
    with torch.no_grad():
        expected = model(x)
    fake_cuda(refuse_capture)

    def out_of_memory():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(torch.cuda, "Stream", out_of_memory)
    lines: list[str] = []
    with cuda_graphs.graphs(log=lines.append), torch.no_grad():
        y, (h, c) = model(x)
    torch.testing.assert_close((y, h, c), (expected[0], *expected[1]), rtol=0, atol=0)
    assert len(lines) == 1 and "capturing a window failed (OutOfMemoryError: CUDA out of memory." in lines[0]


def test_without_a_log_the_line_is_a_warning(fake_cuda):
    fake_cuda(refuse_capture)
    model = moglm.LSTM(4, 5, backend="fused")
    with cuda_graphs.graphs(), pytest.warns(RuntimeWarning, match="moglm: CUDA graphs are off for the rest of this"):
        model(torch.randn(2, 3, 4))


def test_a_layer_whose_windows_keep_changing_stops_capturing_new_ones_and_says_so_once(fake_cuda):
    """Past MAX_WINDOWS_PER_LAYER different windows a layer runs new shapes ungraphed; the windows it captured
    still replay; one line for the whole process, however many layers reach the limit."""
    replays = []

    def graphed(window):  # a "graph" that runs the window itself, counting its replays
        def replay(*args):
            replays.append(args[0].shape[0])
            return window(*args)
        return replay

    cuda = fake_cuda(graphed)
    model = moglm.LSTM(4, 5, 2, backend="fused")
    limit = cuda_graphs.MAX_WINDOWS_PER_LAYER
    lines: list[str] = []
    with cuda_graphs.graphs(log=lines.append):
        for length in range(1, limit + 4):  # a new window length every time
            x = torch.randn(length, 3, 4)
            expected = _train_window(model, x)
            with cuda_graphs.graphs(False):
                plain = _train_window(model, x)
            for a, e in zip(expected, plain):
                torch.testing.assert_close(a, e)
        assert cuda.captures == 2 * limit  # each layer its first `limit` lengths
        assert lines == [f"CUDA graphs: a layer met more than {limit} different windows (shapes that keep changing); "
                         f"each layer replays the {limit} it captured and runs any other window ungraphed"]
        replays.clear()
        _train_window(model, torch.randn(1, 3, 4))  # captured: replayed
        _train_window(model, torch.randn(limit + 1, 3, 4))  # never captured: ungraphed
    assert replays == [1, 1] and cuda.captures == 2 * limit and len(lines) == 1


def test_strict_graphs_raise_instead_of_timing_plain_windows_and_let_the_next_try_capture(fake_cuda):
    """What a benchmark of graphed windows uses: a failed capture is its error, and does not turn graphs off."""
    cuda = fake_cuda(refuse_capture)
    model = moglm.LSTM(4, 5, backend="fused")
    for _ in range(2):
        with cuda_graphs.graphs(strict=True), pytest.raises(RuntimeError, match=r"^CUDA graphs: capturing a window "
                                                            r"failed \(RuntimeError: CUDA error: operation not"):
            model(torch.randn(2, 3, 4))
    assert cuda.captures == 2 and cuda_graphs._failed is None
    # each failure left the stream and the random generator usable before raising
    assert cuda.calls == 2 * ["set_stream(the stream)", "synchronize", "random generator set to a copy of its state"]
