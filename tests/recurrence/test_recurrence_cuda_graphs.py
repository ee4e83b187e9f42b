"""CUDA-graphed windows: what can be checked without a GPU (the device check, the cache key, that CPU windows
never take the graph path). Capture and replay themselves need CUDA and are measured by ``moglm bench
throughput --device cuda``."""

from __future__ import annotations

import pytest
import torch

import moglm
from moglm.recurrence import cuda_graphs

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour of a machine without CUDA")


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
