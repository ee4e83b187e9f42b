"""The GPU path on a real GPU: fused windows with the Triton kernels compiled for the device (not
interpreted), CUDA graphs, and autocast, each against the reference loop. Skipped without CUDA; on a CUDA
machine ``pytest tests/recurrence/test_recurrence_cuda.py`` runs them (benchmarks/gpu_checks.sh does, with the bench)."""

from __future__ import annotations

import contextlib
import copy
import importlib.util

import pytest
import torch

import moglm
from moglm.model.language_model import LanguageModel
from moglm.recurrence import cuda_graphs, fused_cell
from moglm.recurrence.triton_pointwise import TorchPointwise, TritonPointwise, pointwise_for

from test_recurrence_fused import (
    DEVICE_AGNOSTIC, MOGRIFIER_IDS, MOGRIFIERS, OPTIONS, H, M, T, assert_parity, run_backend,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = "cuda"
NAMES = ["mogrifier", "mogrifier_full", "lstm", "multiplicative_lstm"]
triton_needed = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


@pytest.fixture(autouse=True)
def compiled_triton(monkeypatch):
    """The kernels compiled for the GPU, never Triton's interpreter."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("MOGLM_TRITON", raising=False)
    yield
    cuda_graphs.enable(False)


@contextlib.contextmanager
def tf32(on: bool):
    """cuBLAS's TF32 switch inside the block (a property of torch.backends.cuda.matmul, not patchable)."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


@triton_needed
def test_cuda_windows_pick_the_triton_kernels():
    assert pointwise_for(torch.zeros(1, device=CUDA)) is TritonPointwise


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("make", DEVICE_AGNOSTIC, ids=NAMES)
def test_fused_windows_on_cuda_match_the_reference_loop_in_float64(make, mode):
    """Outputs, final states and every gradient (input, initial state, parameters), state dropout on in
    training; the Triton kernels run in float64 on the GPU."""
    model = getattr(make(dtype=torch.float64, device=CUDA), mode)()
    assert_parity(model, model.num_layers, device=CUDA)


@pytest.mark.parametrize("rounds, rank, zigzag", MOGRIFIERS[::3], ids=MOGRIFIER_IDS[::3])
def test_fused_mogrifier_on_cuda_matches_the_reference_over_options(rounds, rank, zigzag):
    for k, (capped, bias, state_dropout) in enumerate(OPTIONS):
        layers = 1 + k % 2
        model = moglm.MogrifierLSTM(M, H, layers, rounds=rounds, rank=rank, zigzag=zigzag, capped_input_gate=capped,
                                    bias=bias, state_dropout=state_dropout, dropout=0.3, dtype=torch.float64,
                                    device=CUDA).train()
        assert_parity(model, layers, device=CUDA)


@pytest.mark.parametrize("make", DEVICE_AGNOSTIC, ids=NAMES)
def test_float32_on_cuda_matches_the_float64_reference_on_cpu(make):
    """Eval mode (no dropout masks, which each device draws its own way); TF32 off, so cuBLAS's float32."""
    model = make(device=CUDA).eval()
    reference = copy.deepcopy(model).to("cpu", torch.float64)
    with tf32(False):
        assert_parity(model, model.num_layers, dtype=torch.float32, device=CUDA, reference=reference,
                      rtol=1e-4, atol=1e-5)


@triton_needed
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=["float64", "float32", "bf16"])
@pytest.mark.parametrize("capped", [False, True], ids=["uncapped", "capped"])
def test_each_compiled_kernel_equals_its_torch_twin_on_cuda(dtype, capped):
    """At sizes that span several Triton programs (B * n > 1024) and on column slices (strided rows)."""
    B, n = 37, 61
    gen = torch.Generator(device=CUDA).manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=CUDA).to(dtype)

    g, c_prev_wide = randn(B, 4 * n), randn(B, n + 2)
    act = torch.sigmoid(randn(B, 4 * n).float()).to(dtype)
    dh, dc_next, c_t = randn(B, n), randn(B, n), randn(B, n)
    pre, old_wide, dnew_wide = randn(B, n), randn(B, n + 4), randn(B, n + 3)
    results = []
    for pointwise in (TorchPointwise, TritonPointwise):
        # the kernels compute half precision in float32 (their contract), so the twin runs on float32 copies
        up = (lambda t: t.float()) if dtype == torch.bfloat16 and pointwise is TorchPointwise else (lambda t: t)
        work = torch.float32 if dtype == torch.bfloat16 and pointwise is TorchPointwise else dtype
        gg, c_prev = up(g.clone()), up(c_prev_wide)[:, 1 : n + 1]
        c_out, h_out, tc = (torch.zeros(B, n, device=CUDA, dtype=work) for _ in range(3))
        pointwise.cell_forward(gg, c_prev, c_out, h_out, tc, capped)
        dG = torch.zeros(B, 4 * n, device=CUDA, dtype=work)
        dc_prev = pointwise.cell_backward(up(dh), up(dc_next), up(act), c_prev, up(c_t),
                                          fused_cell.BackwardScratch(up(dh), B, n), dG[:, : 3 * n], dG[:, 3 * n :],
                                          capped)
        sg, new = torch.zeros(B, n, device=CUDA, dtype=work), torch.zeros(B, 2 * n, device=CUDA, dtype=work)[:, :n]
        pointwise.round_forward(up(pre), up(old_wide)[:, 4:], sg, new)
        dp = torch.zeros(B, n, device=CUDA, dtype=work)
        dold = pointwise.round_backward(up(dnew_wide)[:, :n], up(old_wide)[:, 4:], sg, dp)
        results.append([t.to(dtype) for t in (gg, c_out, h_out, dG, dc_prev, sg, new, dp, dold)])
    tol = {torch.float64: dict(rtol=1e-12, atol=1e-12), torch.float32: dict(rtol=1e-5, atol=1e-5),
           torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}[dtype]
    for i, (got, want) in enumerate(zip(*results[::-1])):
        torch.testing.assert_close(got, want, **tol, msg=lambda m: f"output {i}: {m}")


@triton_needed
@pytest.mark.parametrize("bias, add", [(True, True), (False, False)])
def test_the_round_kernels_equal_their_torch_twin_on_cuda(bias, add):
    from moglm.recurrence.triton_rounds import TorchRounds, TritonRounds
    from test_recurrence_triton import round_kernel_outputs

    with tf32(False):
        got = round_kernel_outputs(TritonRounds, CUDA, bias, add, B=70, n_in=650, n_out=650, k=64)
        want = round_kernel_outputs(TorchRounds, CUDA, bias, add, B=70, n_in=650, n_out=650, k=64)
    for i, (a, b) in enumerate(zip(got, want)):  # sums over 650 terms: compare by relative norm (float32 order)
        assert torch.isfinite(a).all(), f"output {i}: an element was not written"
        assert ((a - b).norm() / b.norm()).item() < 1e-5, f"output {i}"


@triton_needed
@pytest.mark.parametrize("zigzag", [True, False], ids=["zigzag", "no_zigzag"])
def test_float32_mogrifier_on_the_round_kernels_matches_the_float64_reference(zigzag, monkeypatch):
    from moglm.recurrence.triton_rounds import TritonRounds, rounds_for

    monkeypatch.setenv("MOGLM_TRITON_ROUNDS", "1")
    model = moglm.MogrifierLSTM(M, H, 2, rounds=5, rank=3, zigzag=zigzag, device=CUDA).eval()
    assert rounds_for(torch.zeros(1, device=CUDA)) is TritonRounds
    reference = copy.deepcopy(model).to("cpu", torch.float64)
    with tf32(False):
        assert_parity(model, 2, dtype=torch.float32, device=CUDA, reference=reference, rtol=1e-4, atol=1e-5)


@triton_needed
@pytest.mark.parametrize("precision, bound", [("fp32", 1e-5), ("tf32", 5e-3), ("bf16", 3e-2)])
@pytest.mark.parametrize("zigzag", [True, False], ids=["zigzag", "no_zigzag"])
def test_the_step_kernels_at_the_papers_sizes_are_near_their_float64_twin(precision, bound, zigzag):
    """All five rounds of a step in one kernel each way, B = 70, H = 650, k = 64, against the torch twin in
    float64: every output within ``bound`` in relative norm (IEEE float32 products; TF32's 10-bit mantissa;
    bf16 products with float32 accumulation)."""
    from moglm.recurrence.gemm import low_precision_products
    from moglm.recurrence.triton_step_rounds import TorchStepRounds, TritonStepRounds
    from test_recurrence_triton import step_kernel_outputs

    sizes = dict(B=70, m=650, n=650, k=64, device=CUDA)
    with tf32(precision == "tf32"), low_precision_products(torch.bfloat16 if precision == "bf16" else None):
        got = step_kernel_outputs(TritonStepRounds, 5, zigzag, True, True, **sizes)
    want = step_kernel_outputs(TorchStepRounds, 5, zigzag, True, True, dtype=torch.float64, **sizes)
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.isfinite(a).all(), f"output {i}: an element was not written"
        error = ((a.double() - b).norm() / b.norm()).item()
        assert error < bound, f"output {i}: relative error {error:.2e}"


@triton_needed
def test_a_float32_mogrifier_training_window_on_the_step_kernels_matches_the_reference_loop(monkeypatch):
    """Training mode, state dropout on (the same masks on both paths), every gradient."""
    from moglm.recurrence import triton_step_rounds
    from test_recurrence_triton import record_calls

    monkeypatch.setenv("MOGLM_TRITON_ROUNDS", "step")
    calls = record_calls(monkeypatch, triton_step_rounds.TritonStepRounds)
    model = moglm.MogrifierLSTM(M, H, 2, rounds=5, rank=3, state_dropout=0.3, device=CUDA).train()
    with tf32(False):
        assert_parity(model, 2, dtype=torch.float32, device=CUDA, rtol=1e-4, atol=1e-5)
    assert {"forward", "backward"} <= set(calls)


def _graph_parity(make, windows: int = 3, dtype=torch.float64):
    """Graphed windows against plain ones: several windows in a row (replays with new inputs, and an
    optimizer step between them, which a replay must see), outputs, states and every gradient."""
    plain = make(dtype=dtype, device=CUDA).eval()  # eval: no dropout masks, so both runs draw nothing
    graphed = copy.deepcopy(plain)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (plain, graphed)]
    for w in range(windows):
        x = torch.randn(T, 3, M, dtype=dtype, device=CUDA)
        state = tuple(torch.randn(plain.num_layers, 3, H, dtype=dtype, device=CUDA) for _ in range(2))
        got = []
        for model, opt, on in ((plain, opts[0], False), (graphed, opts[1], True)):
            with cuda_graphs.graphs(on, strict=True):
                got.append(run_backend(model, "fused", x, state))
            opt.step()
        for i, (a, e) in enumerate(zip(got[1], got[0])):
            torch.testing.assert_close(a, e, msg=lambda m: f"window {w}, item {i}: {m}")
        with torch.no_grad(), cuda_graphs.graphs(strict=True):
            y_graph, (h_graph, _) = graphed(x, state)
        y_plain, (h_plain, _) = plain.eval()(x, state)
        torch.testing.assert_close(y_graph, y_plain.detach())
        torch.testing.assert_close(h_graph, h_plain.detach())
    assert cuda_graphs._cache, "nothing was captured"


@pytest.mark.parametrize("make", DEVICE_AGNOSTIC, ids=NAMES)
def test_cuda_graphed_windows_equal_plain_windows(make):
    _graph_parity(make)


def test_forward_only_graphed_outputs_outlive_the_next_replay():
    """Evaluation may keep a window's outputs past the layer's next window (the temperature search keeps every
    window's features): a forward-only replay hands out copies, not the graph's buffers."""
    model = moglm.LSTM(M, H, 2, device=CUDA).eval()
    xs = [torch.randn(T, 3, M, device=CUDA) for _ in range(3)]
    with torch.no_grad():
        plain = [model(x)[0] for x in xs]
        with cuda_graphs.graphs(strict=True):
            kept = [model(x)[0] for x in xs]
    assert cuda_graphs._cache, "nothing was captured"
    for a, e in zip(kept, plain):
        torch.testing.assert_close(a, e)


def test_a_capture_failing_on_the_device_falls_back_and_the_device_keeps_working(monkeypatch):
    """A window whose capture fails on the GPU (a synchronize inside the capture, which CUDA refuses) runs
    ungraphed, with one line; graphs are off for the rest of the process; the stream works on, and so does the
    random generator (a failed capture leaves it in capture mode unless moglm takes it out)."""
    from moglm.recurrence import fused_lstm

    model = moglm.LSTM(M, H, 1, device=CUDA).eval()
    x = torch.randn(T, 3, M, device=CUDA)
    with torch.no_grad():
        expected, _ = model(x)
    real = fused_lstm.FusedLSTMFunction.forward_impl

    def synchronizing(*args, **kwargs):
        if torch.cuda.is_current_stream_capturing():
            torch.cuda.synchronize()  # not permitted while a stream captures: the capture fails
        return real(*args, **kwargs)

    monkeypatch.setattr(fused_lstm.FusedLSTMFunction, "forward_impl", staticmethod(synchronizing))
    lines: list[str] = []
    with torch.no_grad(), cuda_graphs.graphs(log=lines.append):
        y, _ = model(x)
        again, _ = model(x + 1)
    torch.testing.assert_close(y, expected)
    assert len(lines) == 1 and "capturing a window failed" in lines[0], lines
    assert cuda_graphs._failed is not None and not cuda_graphs._cache
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    torch.testing.assert_close(again, model(x + 1)[0])  # the device runs on, ungraphed
    torch.manual_seed(3)
    draws = torch.rand(5, device=CUDA), torch.nn.functional.dropout(x, 0.5)  # random draws work after it
    torch.manual_seed(3)
    torch.testing.assert_close(draws, (torch.rand(5, device=CUDA), torch.nn.functional.dropout(x, 0.5)))


def test_a_tf32_switch_recaptures_instead_of_replaying_float32_kernels():
    model = moglm.MogrifierLSTM(M, H, 1, rounds=3, rank=2, device=CUDA)
    x = torch.randn(T, 3, M, device=CUDA)
    keys = []
    for on in (False, True):
        with tf32(on), torch.no_grad(), cuda_graphs.graphs(strict=True):
            model(x)
        keys.append(set(cuda_graphs._cache))
    assert keys[1] > keys[0]


@pytest.mark.parametrize("make", DEVICE_AGNOSTIC, ids=NAMES)
def test_bf16_autocast_windows_stay_float32_and_near_the_float32_reference(make):
    """Under autocast the window's products run in bf16 and its states and results stay float32; they
    are within bf16 rounding of the float32 reference loop (relative error of the outputs below 2e-2)."""
    model = make(device=CUDA).eval()
    x = torch.randn(T, 3, M, device=CUDA)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        model.backend = "fused"
        y, (h, c) = model(x)
    model.backend = "reference"
    y_ref, _ = model(x)
    assert y.dtype == h.dtype == c.dtype == torch.float32
    error = ((y.float() - y_ref).norm() / y_ref.norm()).item()
    assert error < 2e-2, error
    y.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_a_language_model_trains_a_step_on_cuda_like_on_cpu():
    """The whole model (embedding, stack, softmax) on CUDA gives the CPU's loss and gradients in float64."""
    torch.manual_seed(0)
    cpu = LanguageModel(50, 16, num_layers=2, architecture="mogrifier",
                              cell_options={"rounds": 3, "rank": 4}).double()
    cpu.eval()
    gpu = copy.deepcopy(cpu).to(CUDA)
    assert gpu.rnn.backend == "auto"  # the path a user gets: fused windows on CUDA, chosen by auto
    tokens = torch.randint(0, 50, (9, 3))
    losses, grads = [], []
    for model, device in ((cpu, "cpu"), (gpu, CUDA)):
        nll, _ = model.nll(tokens[:-1].to(device), tokens[1:].to(device))
        nll.mean().backward()
        losses.append(nll.mean().item())
        grads.append([p.grad.cpu() for p in model.parameters()])
    assert losses[0] == pytest.approx(losses[1], rel=1e-10)
    for a, b in zip(grads[1], grads[0]):
        torch.testing.assert_close(a, b)


def test_training_with_cuda_graphs_gives_the_weights_of_training_without(tiny_corpus, tmp_path):
    """train.cuda_graphs: the same steps (dropout masks included) give the same weights, replayed as graphs;
    auto (the default) is graphed on one CUDA device, and nothing turned graphs off on the way."""
    from conftest import tiny_config
    from moglm.train.trainer import Trainer

    weights, lines = [], []
    for graphs in (False, None, True):
        cfg = tiny_config(tiny_corpus, train={"device": CUDA, "cuda_graphs": graphs, "max_steps": 6, "eval_every": 3})
        trainer = Trainer(cfg, tmp_path / f"run-{graphs}", progress=False, log=lines.append)
        trainer.train()
        assert trainer.engine.graphed is (graphs is not False)
        weights.append({k: v.detach().cpu() for k, v in trainer.model.state_dict().items()})
    assert not [line for line in lines if "CUDA graphs" in line], lines
    assert cuda_graphs._cache, "nothing was captured"
    for graphed in weights[1:]:
        for name in weights[0]:
            torch.testing.assert_close(graphed[name], weights[0][name], rtol=1e-4, atol=1e-5,
                                       msg=lambda m: f"{name}: {m}")
