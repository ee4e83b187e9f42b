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


def record_calls(monkeypatch, kernels) -> list[str]:
    """Record each call of ``kernels.forward`` / ``kernels.backward`` (still run) by name in the returned list."""
    calls: list[str] = []
    for name in ("forward", "backward"):
        original = getattr(kernels, name)
        monkeypatch.setattr(kernels, name, staticmethod(lambda *a, _f=original, _n=name: calls.append(_n) or _f(*a)))
    return calls


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
@pytest.mark.slow
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


# -- the low-rank round kernels (moglm.recurrence.triton_rounds) ----------------------------------------------


def round_kernel_outputs(rounds, device, bias: bool, add: bool, B=37, n_in=70, n_out=83, k=5):
    """Forward and backward of one round through ``rounds`` on fresh random float32 tensors (seed 0), with
    column slices (strided rows) for the inputs a window passes as views; more rows than one program takes
    (16), more columns than one block (64), a rank that is no power of two."""
    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device)

    src = randn(B, n_in + 3)[:, 3:]
    right, left = randn(k, n_in) / n_in**0.5, randn(n_out, k) / k**0.5  # p of order 1, as initialised models have
    b = randn(n_out) if bias else None
    old = randn(B, n_out + 2)[:, 2:]
    sg, new = torch.full((B, n_out), float("nan"), device=device), torch.full((B, 2 * n_out), float("nan"),
                                                                             device=device)[:, :n_out]
    low = rounds.forward(src, right, left, b, old, sg, new)
    dnew = randn(B, n_out + 1)[:, 1:]
    dp = torch.full((B, n_out), float("nan"), device=device)
    extra = randn(B, n_in + 5)[:, :n_in] if add else None
    dold, dlow, d_src = rounds.backward(dnew, old, sg, dp, left, right, extra)
    return [low, sg, new, dp, dold, dlow, d_src]


@pytest.mark.parametrize("bias, add", [(True, True), (False, False), (True, False)])
def test_the_round_kernels_equal_their_torch_twin(bias, add, monkeypatch):
    from moglm.recurrence import triton_rounds
    from moglm.recurrence.triton_rounds import TorchRounds, TritonRounds

    names = ["low", "sg", "new", "dp", "dold", "dlow", "d src"]
    for config in ({}, {"BLOCK_B": 32, "BLOCK_N": 32, "BLOCK_K": 64}):  # the default and another block shape
        monkeypatch.setattr(triton_rounds, "CONFIG", {**triton_rounds.CONFIG, **config})
        got = round_kernel_outputs(TritonRounds, "cpu", bias, add)
        want = round_kernel_outputs(TorchRounds, "cpu", bias, add)
        assert_round_outputs_close(names, got, want)


def assert_round_outputs_close(names, got, want):
    for name, a, b in zip(names, got, want):
        assert torch.isfinite(a).all(), f"{name}: an element was not written"
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("zigzag", [True, False], ids=["zigzag", "no_zigzag"])
@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.slow
def test_float32_mogrifier_windows_on_the_round_kernels_match_the_reference_loop(zigzag, mode, monkeypatch):
    """Each low-rank round one kernel forward and one backward, in 1 and 2 layers, with and without biases."""
    from moglm.recurrence import triton_rounds

    monkeypatch.setenv("MOGLM_TRITON_ROUNDS", "1")
    calls = record_calls(monkeypatch, triton_rounds.TritonRounds)
    for layers, bias in ((1, True), (2, False)):
        model = getattr(moglm.MogrifierLSTM(7, 5, layers, rounds=5, rank=3, zigzag=zigzag, bias=bias,
                                            state_dropout=0.2), mode)()
        assert_parity(model, layers, dtype=torch.float32, rtol=1e-4, atol=1e-5)
    assert {"forward", "backward"} <= set(calls)


def test_the_round_kernels_are_opt_in_and_skip_other_dtypes(monkeypatch):
    from moglm.recurrence.gemm import low_precision_products
    from moglm.recurrence.triton_rounds import TorchRounds, TritonRounds, rounds_for

    monkeypatch.delenv("MOGLM_TRITON_ROUNDS", raising=False)
    assert rounds_for(torch.zeros(1)) is TorchRounds  # off by default: slower than cuBLAS on an H200
    monkeypatch.setenv("MOGLM_TRITON_ROUNDS", "1")
    assert rounds_for(torch.zeros(1)) is TritonRounds
    assert rounds_for(torch.zeros(1, dtype=torch.float64)) is TorchRounds
    with low_precision_products(torch.bfloat16):
        assert rounds_for(torch.zeros(1)) is TorchRounds
    monkeypatch.setenv("MOGLM_TRITON_ROUNDS", "0")
    assert rounds_for(torch.zeros(1)) is TorchRounds


# -- all the rounds of a step in one kernel (moglm.recurrence.triton_step_rounds) ------------------------------


def step_kernel_outputs(step, rounds: int, zigzag: bool, bias: bool, masked: bool, B=37, m=70, n=83, k=5,
                        device="cpu", dtype=torch.float32):
    """Forward and backward of one step's rounds through ``step`` on fresh random buffers (seed 0, drawn in
    float32 on the CPU, then moved to ``device`` and ``dtype``): more rows than one program takes (16), more
    columns than one block (64), input and hidden widths that differ, a rank that is no power of two, and h~
    read through a column slice as the window passes it."""
    from moglm.recurrence.triton_step_rounds import StepChains, step_weights

    gen = torch.Generator().manual_seed(0)
    nq, nr = (rounds + 1) // 2, rounds // 2

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device, dtype)

    def nan(*shape):
        return torch.full(shape, float("nan"), device=device, dtype=dtype)

    p = {"mogrifier_q_left": randn(nq, m, k, scale=k**-0.5), "mogrifier_q_right": randn(nq, k, n, scale=n**-0.5),
         "mogrifier_r_left": randn(nr, n, k, scale=k**-0.5), "mogrifier_r_right": randn(nr, k, m, scale=m**-0.5)}
    if bias:
        p.update(mogrifier_q_bias=randn(nq, m), mogrifier_r_bias=randn(nr, n))
    w = step_weights(p, m, n, zigzag)
    xh = nan(B, m + n)
    h0 = xh[:, m:] if nr == 0 else randn(B, n + 3)[:, 3:]
    if nr == 0:
        h0.copy_(randn(B, n))
    ch = StepChains(randn(B, m), h0, nan(nq - 1, B, m), nan(max(nr - 1, 0), B, n), xh, nan(nq, B, m), nan(nr, B, n))
    low = nan(rounds, B, k)
    step.forward(w, ch, low)
    forward = [low, ch.xc, ch.hc, xh.clone(), ch.sgx, ch.sgh]
    dxh = randn(B, m + n)
    dpx, dph, dlow, dx, dh = nan(nq, B, m), nan(nr, B, n), nan(rounds, B, k), nan(B, m), nan(B, n)
    mask = ((torch.rand(B, n, generator=gen) > 0.3).float() / 0.7).to(device, dtype) if masked else None
    step.backward(w, ch, dxh, dpx, dph, dlow, dx, dh, mask)
    return forward + [dpx, dph, dlow, dx, dh]


@pytest.mark.parametrize("rounds, zigzag, bias, masked", [(5, True, True, True), (6, True, False, False),
                                                          (5, False, True, False), (4, False, False, True),
                                                          (1, True, True, True), (2, True, True, False)])
def test_the_step_kernels_equal_their_torch_twin(rounds, zigzag, bias, masked, monkeypatch):
    from moglm.recurrence import triton_step_rounds
    from moglm.recurrence.triton_step_rounds import TorchStepRounds, TritonStepRounds

    names = ["low", "x chain", "h chain", "[x_up; h_up]", "x gates", "h gates", "dp x", "dp h", "dlow", "dx",
             "dh"]
    for config in ({}, {"BLOCK_B": 32, "BLOCK_C": 32}):  # the default and another block shape
        monkeypatch.setattr(triton_step_rounds, "CONFIG", {**triton_step_rounds.CONFIG, **config})
        got = step_kernel_outputs(TritonStepRounds, rounds, zigzag, bias, masked)
        want = step_kernel_outputs(TorchStepRounds, rounds, zigzag, bias, masked)
        assert_round_outputs_close(names, got, want)


@pytest.mark.parametrize("zigzag", [True, False], ids=["zigzag", "no_zigzag"])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_float32_mogrifier_windows_on_the_step_kernels_match_the_float64_reference_loop(zigzag, mode, monkeypatch):
    """``MOGLM_TRITON_ROUNDS=step``: every round of a step in one kernel each way. A float32 model against its
    float64 copy's reference loop (outputs, final states, every gradient), 1 and 2 layers, odd rounds and
    even, with and without biases, state dropout in training."""
    import copy

    from moglm.recurrence import triton_step_rounds

    monkeypatch.setenv("MOGLM_TRITON_ROUNDS", "step")
    calls = record_calls(monkeypatch, triton_step_rounds.TritonStepRounds)
    for layers, rounds, bias in ((1, 5, True), (2, 4, False)):
        model = getattr(moglm.MogrifierLSTM(7, 5, layers, rounds=rounds, rank=3, zigzag=zigzag, bias=bias,
                                            state_dropout=0.2), mode)()
        reference = copy.deepcopy(model).double()
        assert_parity(model, layers, dtype=torch.float32, reference=reference, rtol=1e-4, atol=1e-5)
    assert {"forward", "backward"} <= set(calls)


def test_the_step_kernels_are_opt_in_and_skip_what_they_cannot_run(monkeypatch):
    """Off by default: on an H200 the step kernel was slower than the per-round cuBLAS path it replaces
    (docs/performance/nvidia-h200.md)."""
    from moglm.recurrence.gemm import low_precision_products
    from moglm.recurrence.triton_step_rounds import TritonStepRounds, step_rounds_for

    spec = _spec(rounds=5, rank=3)
    monkeypatch.delenv("MOGLM_TRITON_ROUNDS", raising=False)
    assert step_rounds_for(torch.zeros(1), spec) is None
    monkeypatch.setenv("MOGLM_TRITON_ROUNDS", "step")
    assert step_rounds_for(torch.zeros(1), spec) is TritonStepRounds
    assert step_rounds_for(torch.zeros(1, dtype=torch.float64), spec) is None  # float32 kernels only
    assert step_rounds_for(torch.zeros(1), _spec(rounds=5, rank=0)) is None  # full rank: cuBLAS products
    with low_precision_products(torch.bfloat16):
        assert step_rounds_for(torch.zeros(1), spec) is TritonStepRounds  # bf16 products inside the kernel
    monkeypatch.delenv("TRITON_INTERPRET")
    assert step_rounds_for(torch.zeros(1), spec) is None  # a CPU tensor runs the CPU path
    for other in ("round", "1", "0"):
        monkeypatch.setenv("MOGLM_TRITON_ROUNDS", other)
        assert step_rounds_for(torch.zeros(1), spec) is None


def _spec(rounds: int, rank: int):
    from moglm.recurrence.fused_lstm import LayerSpec

    return LayerSpec(7, 5, rounds, rank, True, False, ())
