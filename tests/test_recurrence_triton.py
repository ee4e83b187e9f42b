"""The Triton pointwise kernels of the GPU path, run on CPU by Triton's interpreter (``TRITON_INTERPRET=1``):
each kernel against its torch twin, and whole fused windows using them against the reference loop."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import moglm
from moglm.recurrence import fused_cell, gemm
from moglm.recurrence.triton_pointwise import TorchPointwise, TritonPointwise, pointwise_for

from test_recurrence_fused import DEVICE_AGNOSTIC, assert_parity

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="triton is not installed: the GPU path's kernels are tested only where it is (pip install 'moglm[gpu]')",
)


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    """Triton's CPU interpreter, and the torch-op path CUDA takes (torch.mm, torch.tanh) around the kernels."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv("MOGLM_TRITON", raising=False)
    monkeypatch.setattr(gemm, "ONEDNN", False)
    monkeypatch.setattr(fused_cell, "SIGMOID_TANH_DEVICES", set())


B, N = 3, 5  # odd sizes


def _randn(*shape, dtype, gen):
    return torch.randn(*shape, dtype=dtype, generator=gen)


def _both(fn):
    """Run ``fn(pointwise, tensors)`` on twin copies of the same tensors; returns both results and copies."""
    results = []
    for pointwise in (TorchPointwise, TritonPointwise):
        gen = torch.Generator().manual_seed(0)
        results.append(fn(pointwise, gen))
    return results


TOLERANCES = {torch.float64: dict(rtol=1e-12, atol=1e-12), torch.float32: dict(rtol=1e-5, atol=1e-6)}
DTYPES = [torch.float64, torch.float32]


@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "float32"])
@pytest.mark.parametrize("capped", [False, True], ids=["uncapped", "capped"])
def test_cell_forward_kernel_equals_the_torch_ops(dtype, capped):
    def run(pointwise, gen):
        g = _randn(B, 4 * N, dtype=dtype, gen=gen)
        c_prev = _randn(B, N + 2, dtype=dtype, gen=gen)[:, 1 : N + 1]  # a column slice: strided rows
        c_out, h_out, tc = (torch.zeros(B, N, dtype=dtype) for _ in range(3))
        pointwise.cell_forward(g, c_prev, c_out, h_out, tc, capped)
        return g, c_out, h_out

    for got, want in zip(*_both(run)):
        torch.testing.assert_close(got, want, **TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "float32"])
@pytest.mark.parametrize("capped", [False, True], ids=["uncapped", "capped"])
def test_cell_backward_kernel_equals_the_torch_ops(dtype, capped):
    def run(pointwise, gen):
        act = torch.sigmoid(_randn(B, 4 * N, dtype=dtype, gen=gen))
        act[:, 3 * N :] = act[:, 3 * N :] * 2 - 1  # j is a tanh
        if capped:  # ties between i and 1 - f, where torch.minimum splits the gradient
            act[0, :N] = 1 - act[0, N : 2 * N]
        dh, dc_next, c_prev, c_t = (_randn(B, N, dtype=dtype, gen=gen) for _ in range(4))
        dG = torch.zeros(B, 4 * N, dtype=dtype)
        dc_prev = pointwise.cell_backward(dh, dc_next, act, c_prev, c_t, fused_cell.BackwardScratch(dh, B, N),
                                          dG[:, : 3 * N], dG[:, 3 * N :], capped)
        return dG, dc_prev

    for got, want in zip(*_both(run)):
        torch.testing.assert_close(got, want, **TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "float32"])
def test_round_kernels_equal_the_torch_ops_on_column_slices(dtype):
    """A round reads and writes column slices of ``[x_up; h_up]``, so the kernels take row strides."""
    def run(pointwise, gen):
        pre = _randn(B, N, dtype=dtype, gen=gen)
        old = _randn(B, N + 4, dtype=dtype, gen=gen)[:, 4:]
        sg, new = torch.zeros(B, N, dtype=dtype), torch.zeros(B, 2 * N, dtype=dtype)[:, :N]
        pointwise.round_forward(pre, old, sg, new)
        dnew = _randn(B, N + 3, dtype=dtype, gen=gen)[:, :N]
        dp = torch.zeros(B, N, dtype=dtype)
        dold = pointwise.round_backward(dnew, old, sg, dp)
        return sg, new, dp, dold

    for got, want in zip(*_both(run)):
        torch.testing.assert_close(got, want, **TOLERANCES[dtype])


def test_a_tensor_whose_rows_are_not_contiguous_is_refused_not_misread():
    x = torch.zeros(4, 6, dtype=torch.float64)
    with pytest.raises(ValueError, match="contiguous rows"):
        TritonPointwise.round_forward(x[:, ::2], x[:, :3], x[:, 3:], x[:, :3].clone())


def test_the_kernels_are_picked_under_the_interpreter_and_switched_off_by_moglm_triton(monkeypatch):
    assert pointwise_for(torch.zeros(1)) is TritonPointwise
    monkeypatch.setenv("MOGLM_TRITON", "0")
    assert pointwise_for(torch.zeros(1)) is TorchPointwise
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.delenv("MOGLM_TRITON")
    assert pointwise_for(torch.zeros(1)) is TorchPointwise  # a CPU tensor runs torch ops


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("make", DEVICE_AGNOSTIC, ids=["mogrifier", "mogrifier_full", "lstm", "multiplicative_lstm"])
def test_fused_windows_on_the_kernels_match_the_reference_loop(make, mode):
    """Outputs, final states and every gradient (input, initial state, parameters) in float64, in training
    (state dropout on) and in eval mode: dynamic evaluation's backward with dropout off."""
    model = make(dtype=torch.float64)
    getattr(model, mode)()
    assert pointwise_for(torch.zeros(1, dtype=torch.float64)) is TritonPointwise
    assert_parity(model, model.num_layers)


def test_float32_windows_on_the_kernels_match_the_reference_loop():
    model = moglm.MogrifierLSTM(7, 5, 2, rounds=5, rank=2, capped_input_gate=True, state_dropout=0.2).train()
    assert_parity(model, 2, dtype=torch.float32, rtol=1e-4, atol=1e-5)


def test_a_loss_on_the_final_cell_state_alone_backpropagates_through_the_kernels():
    """autograd hands dL/dc_T over as an expanded (stride 0) tensor when the loss is ``c_n.sum()``."""
    model = moglm.MogrifierLSTM(7, 5, 2, rounds=3, rank=2, dtype=torch.float64)
    x = torch.randn(4, 3, 7, dtype=torch.float64)
    grads = []
    for backend in ("reference", "fused"):
        model.backend = backend
        model.zero_grad()
        model(x)[1][1].sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for got, want in zip(*grads[::-1]):
        torch.testing.assert_close(got, want)
