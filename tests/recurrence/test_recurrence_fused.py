"""The fused recurrences against the reference loop: outputs, final states and every gradient, plus the
fallback rules (what runs where, and that it is said once)."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch

import moglm
from moglm.cells import LSTMCell, MogrifierLSTMCell
from moglm.modules import RecurrentStack
from moglm.recurrence import FusedFallbackWarning, fallback, fused_cell, gemm, run_layer

D = torch.float64
T, B, M, H = 6, 3, 7, 5  # odd sizes: input 7, hidden 5


def run_backend(model, backend, x, state, seed=1):
    """Forward (masks drawn from ``seed``) and backward of a fixed random functional of (y, h_n, c_n).
    Returns ``[y, h_n, c_n, dx, dh0, dc0, *dparams]``."""
    model.backend = backend
    model.zero_grad()
    x = x.clone().requires_grad_()
    state = tuple(s.clone().requires_grad_() for s in state)
    torch.manual_seed(seed)
    y, (h, c) = model(x, state)
    g = torch.Generator().manual_seed(2)
    loss = sum((t * torch.randn(t.shape, generator=g, dtype=D).to(t.device, t.dtype)).sum() for t in (y, h, c))
    loss.backward()
    return [y, h, c, x.grad, *(s.grad for s in state), *(p.grad for p in model.parameters())]


def assert_parity(model, layers, dtype=D, backend="fused", batch=B, device="cpu", reference=None, **tol):
    """``backend`` against the reference loop on one random window: outputs, final states, every gradient.
    ``reference``: another model (e.g. a float64 CPU copy) whose reference loop gives the expected values."""
    x = torch.randn(T, batch, M, dtype=dtype).to(device)
    state = tuple(torch.randn(layers, batch, H, dtype=dtype).to(device) for _ in range(2))
    if reference is None:
        expected = run_backend(model, "reference", x, state)
    else:
        expected = run_backend(reference, "reference", x.to(reference_device(reference), torch.float64),
                               tuple(s.to(reference_device(reference), torch.float64) for s in state))
        expected = [e.to(device, dtype) for e in expected]
    actual = run_backend(model, backend, x, state)
    names = ["y", "h_n", "c_n", "d input", "d h0", "d c0", *(f"d {n}" for n, _ in model.named_parameters())]
    for name, a, e in zip(names, actual, expected):
        assert a is not None and e is not None, name
        torch.testing.assert_close(a, e, **tol, msg=lambda m: f"{name}: {m}")


def reference_device(model) -> torch.device:
    return next(model.parameters()).device


OPTIONS = list(itertools.product([False, True], [True, False], [0.0, 0.4]))  # capped, bias, state dropout


MOGRIFIERS = [(0, 2, True)] + list(itertools.product(range(1, 7), [2, 0], [True, False]))  # rounds, rank, zigzag
MOGRIFIER_IDS = [f"r{r}-{'k2' if k else 'full'}-{'zz' if z else 'nozz'}" for r, k, z in MOGRIFIERS]


def assert_mogrifier_parity_over_options(rounds, rank, zigzag, backend):
    """Every option combination (capped gate, bias, state dropout) at (rounds, rank, zigzag), 1 and 2 layers."""
    for k, (capped, bias, state_dropout) in enumerate(OPTIONS):
        layers = 1 + k % 2
        model = moglm.MogrifierLSTM(
            M, H, layers, rounds=rounds, rank=rank, zigzag=zigzag, capped_input_gate=capped, bias=bias,
            state_dropout=state_dropout, dropout=0.3, dtype=D,
        ).train()
        assert_parity(model, layers, backend=backend)


def assert_parity_in_1_and_2_layers(module, capped, bias, state_dropout, backend):
    for layers in (1, 2):
        model = module(M, H, layers, capped_input_gate=capped, bias=bias, state_dropout=state_dropout,
                       dropout=0.3, dtype=D).train()
        assert_parity(model, layers, backend=backend)


@pytest.mark.parametrize("rounds, rank, zigzag", MOGRIFIERS, ids=MOGRIFIER_IDS)
def test_fused_mogrifier_matches_reference_outputs_states_and_all_gradients(rounds, rank, zigzag):
    assert_mogrifier_parity_over_options(rounds, rank, zigzag, "fused")


@pytest.mark.parametrize("capped, bias, state_dropout", OPTIONS)
@pytest.mark.parametrize("module", [moglm.LSTM, moglm.MultiplicativeLSTM])
def test_fused_lstm_and_multiplicative_lstm_match_reference(module, capped, bias, state_dropout):
    assert_parity_in_1_and_2_layers(module, capped, bias, state_dropout, "fused")


@pytest.mark.skipif(not gemm.use_onednn(torch.zeros(1)), reason="oneDNN matmul not available")
@pytest.mark.parametrize(
    "make",
    [
        lambda: moglm.LSTM(M, H, 2, state_dropout=0.3, dropout=0.2),
        lambda: moglm.MogrifierLSTM(M, H, 2, rounds=5, rank=3, state_dropout=0.3, capped_input_gate=True),
        lambda: moglm.MogrifierLSTM(M, H, 1, rounds=4, rank=0, zigzag=False),
        lambda: moglm.MultiplicativeLSTM(M, H, 2, state_dropout=0.3),
    ],
    ids=["lstm", "mogrifier", "mogrifier_full_no_zigzag", "multiplicative_lstm"],
)
def test_float32_on_the_onednn_matmul_matches_reference(make):
    model = make().train()
    layers = model.num_layers
    assert_parity(model, layers, dtype=torch.float32, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not gemm.use_onednn(torch.zeros(1)), reason="oneDNN matmul not available")
def test_gemm_helpers_match_torch_mm(monkeypatch):
    monkeypatch.setattr(gemm, "CHUNK_ROWS", 7)
    x, w, b = torch.randn(20, 9), torch.randn(11, 9), torch.randn(11)
    other = torch.randn(20, 11)
    lin = gemm.Linear(w, b, rows=4)
    assert lin.onednn
    torch.testing.assert_close(lin(x), torch.addmm(b, x, w.t()))
    torch.testing.assert_close(lin(x, add=other), torch.addmm(b, x, w.t()) + other)
    torch.testing.assert_close(lin(x.t().contiguous().t()), torch.addmm(b, x, w.t()))  # strided input
    torch.testing.assert_close(lin.rows(x), torch.addmm(b, x, w.t()))
    a, c = torch.randn(40, 300), torch.randn(40, 260)
    torch.testing.assert_close(gemm.matmul_tn(a, c), a.t() @ c, rtol=1e-4, atol=1e-4)
    monkeypatch.setattr(gemm, "ONEDNN", False)
    assert not gemm.Linear(w).onednn


DEVICE_AGNOSTIC = [
    lambda **kw: moglm.MogrifierLSTM(M, H, 2, rounds=5, rank=2, state_dropout=0.3, **kw),
    lambda **kw: moglm.MogrifierLSTM(M, H, 2, rounds=4, rank=0, zigzag=False, capped_input_gate=True, **kw),
    lambda **kw: moglm.LSTM(M, H, 2, state_dropout=0.3, **kw),
    lambda **kw: moglm.MultiplicativeLSTM(M, H, 2, state_dropout=0.3, **kw),
]


@pytest.mark.parametrize("make", DEVICE_AGNOSTIC, ids=["mogrifier", "mogrifier_full", "lstm", "multiplicative_lstm"])
def test_the_non_cpu_code_path_matches_reference(make, monkeypatch):
    """What CUDA runs (torch.mm, torch.tanh) checked on CPU in float64, and shapes checked on 'meta'."""
    monkeypatch.setattr(gemm, "ONEDNN", False)
    monkeypatch.setattr(fused_cell, "SIGMOID_TANH_DEVICES", set())
    model = make(dtype=D).train()
    assert_parity(model, model.num_layers)
    meta = make(device="meta", backend="fused").train()
    x = torch.empty(T, B, M, device="meta", requires_grad=True)
    y, (h, c) = meta(x)
    y.sum().backward()
    assert "Fused" in type(y.grad_fn).__name__ and x.grad.shape == x.shape
    assert all(p.grad.shape == p.shape for p in meta.parameters())


TWO_LAYER_MODELS = [
    lambda **kw: moglm.MogrifierLSTM(M, H, 2, rounds=5, rank=2, **kw),
    lambda **kw: moglm.MogrifierLSTM(M, H, 2, rounds=2, rank=0, zigzag=False, capped_input_gate=True, **kw),
    lambda **kw: moglm.LSTM(M, H, 2, **kw),
    lambda **kw: moglm.MultiplicativeLSTM(M, H, 2, **kw),
]
TWO_LAYER_IDS = ["mogrifier", "mogrifier_full", "lstm", "multiplicative_lstm"]


@pytest.mark.parametrize("make", TWO_LAYER_MODELS, ids=TWO_LAYER_IDS)
def test_forward_only_evaluation_equals_the_training_forward(make):
    assert_forward_only_equals_training(make, "fused")


def assert_forward_only_equals_training(make, backend):
    """Eval mode and no_grad (nothing saved) give the training forward's outputs, with and without dropout."""
    x = torch.randn(T, B, M, dtype=D)
    model = make(dtype=D, backend=backend)
    y_train, (h_train, c_train) = model.train()(x)
    assert y_train.grad_fn is not None
    y_eval, (h_eval, c_eval) = model.eval()(x)
    with torch.no_grad():
        y_nograd, _ = model(x)
    for a, b in ((y_eval, y_train), (h_eval, h_train), (c_eval, c_train), (y_nograd, y_train)):
        torch.testing.assert_close(a, b.detach(), rtol=1e-12, atol=1e-12)  # same ops (BLAS may round differently)
    dropped = make(dtype=D, backend=backend, state_dropout=0.4, dropout=0.3).train()
    torch.manual_seed(3)
    y_grad, _ = dropped(x)
    torch.manual_seed(3)
    with torch.no_grad():
        y_free, _ = dropped(x)  # same masks, no graph
    torch.testing.assert_close(y_free, y_grad.detach(), rtol=1e-12, atol=1e-12)


class RecordingLSTMCell(LSTMCell):
    """A cell type the fused path does not know (it could change the step)."""


def test_unknown_cell_type_falls_back_to_reference_and_says_so_once(monkeypatch):
    monkeypatch.setattr(fallback, "_warned", set())
    model = RecurrentStack([RecordingLSTMCell(M, H)], dtype=D)
    x = torch.randn(T, B, M, dtype=D)
    with pytest.warns(FusedFallbackWarning, match="RecordingLSTMCell"):
        y, _ = model(x)
    assert "Fused" not in type(y.grad_fn).__name__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(x)  # said once
    model.backend = "reference"
    torch.testing.assert_close(model(x)[0], y)
    model.backend = "fused"
    with pytest.raises(ValueError, match="fused.*RecordingLSTMCell"):
        model(x)


@pytest.mark.parametrize("make", [lambda: moglm.GRU(M, H), lambda: moglm.RNN(M, H), lambda: moglm.MogrifierGRU(M, H, rank=2)],
                         ids=["gru", "rnn", "mogrifier_gru"])
def test_cells_without_any_fused_path_run_the_reference_loop_without_a_warning(make, monkeypatch):
    monkeypatch.setattr(fallback, "_warned", set())
    model = make()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(torch.randn(T, B, M))
    model.backend = "fused"
    with pytest.raises(ValueError, match="fused"):
        model(torch.randn(T, B, M))


def test_the_fallback_warning_points_at_the_users_line_and_names_both_ways_to_silence_it(monkeypatch):
    monkeypatch.setattr(fallback, "_warned", set())
    model = RecurrentStack([RecordingLSTMCell(M, H)], dtype=D)
    with pytest.warns(FusedFallbackWarning) as caught:
        model(torch.randn(T, B, M, dtype=D))
    assert caught[0].filename == __file__
    assert "backend='reference'" in str(caught[0].message) and "model.backend" in str(caught[0].message)


def test_replaced_step_on_an_instance_falls_back(monkeypatch):
    monkeypatch.setattr(fallback, "_warned", set())
    model = moglm.LSTM(M, H, dtype=D)
    calls = []
    original = model.cells[0].step

    def step(params, x, state):
        calls.append(1)
        return original(params, x, state)

    model.cells[0].step = step
    with pytest.warns(FusedFallbackWarning, match="step was replaced"):
        model(torch.randn(T, B, M, dtype=D))
    assert len(calls) == T


def test_unsupported_runtime_conditions_fall_back_or_raise(monkeypatch):
    monkeypatch.setattr(fallback, "_warned", set())
    cell = MogrifierLSTMCell(M, H, rounds=3, rank=2)
    model = RecurrentStack([cell], dtype=D)
    params = model.layer_parameters(0)
    x = torch.randn(T, B, M, dtype=D)
    state = cell.zero_state(B, x)
    mask = torch.rand(B, H, dtype=D, requires_grad=True)
    with pytest.warns(FusedFallbackWarning, match="mask that requires grad"):
        y, _ = run_layer(cell, params, x, state, mask)
    y.sum().backward()
    assert mask.grad is not None
    with pytest.raises(ValueError, match="mask that requires grad"):
        run_layer(cell, params, x, state, mask, backend="fused")
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with pytest.raises(ValueError, match="torch.compile"):
        run_layer(cell, params, x, state, backend="fused")


@pytest.mark.parametrize("make", DEVICE_AGNOSTIC, ids=["mogrifier", "mogrifier_full", "lstm", "multiplicative_lstm"])
def test_autocast_runs_the_fused_window_with_low_precision_products_and_float32_states(make):
    """Under bf16 autocast the fused window runs (no fallback), keeps float32 states and results, and its
    outputs and gradients agree with float32 to bf16's precision; every product really ran in bf16."""
    model = make().train()
    x, state = torch.randn(T, B, M), (torch.randn(model.num_layers, B, H), torch.randn(model.num_layers, B, H))
    expected = run_backend(model, "fused", x, state)
    calls = []
    real_mm = torch.mm

    def spy(a, b, **kw):
        calls.append(a.dtype)
        return real_mm(a, b, **kw)

    with warnings.catch_warnings(), torch.autocast("cpu", dtype=torch.bfloat16):
        warnings.simplefilter("error", FusedFallbackWarning)
        with pytest.MonkeyPatch.context() as m:
            m.setattr(torch, "mm", spy)
            actual = run_backend(model, "auto", x, state)
    assert calls and set(calls) == {torch.bfloat16}
    for name, a, e in zip(["y", "h_n", "c_n", "d input", "d h0", "d c0"], actual, expected):
        assert a.dtype == torch.float32, name
        torch.testing.assert_close(a, e, rtol=0.05, atol=0.05, msg=lambda msg: f"{name}: {msg}")
    grads = [(a, e) for a, e in zip(actual[6:], expected[6:])]
    assert all(torch.isfinite(a).all() and torch.nn.functional.cosine_similarity(a.flatten(), e.flatten(), 0) > 0.99
               for a, e in grads)


def test_double_backward_recomputes_with_the_reference_loop_once(monkeypatch):
    monkeypatch.setattr(fallback, "_warned", set())
    assert_double_backward_matches_reference(moglm.MogrifierLSTM(M, H, 2, rounds=3, rank=2, dtype=D), "fused")


def assert_double_backward_matches_reference(model, backend):
    """Gradients of a function of ``create_graph=True`` input gradients equal the reference loop's; the
    fast backend says (once) that it differentiates the reference loop for this."""
    x = torch.randn(T, B, M, dtype=D, requires_grad=True)
    results = []
    for name in ("reference", backend):
        model.backend = name
        model.zero_grad()
        y, _ = model(x)
        assert name == "reference" or name.capitalize() in type(y.grad_fn).__name__
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            (dx,) = torch.autograd.grad((y**2).sum(), x, create_graph=True)
        assert [str(w.message) for w in caught if "double backward" in str(w.message)] or name == "reference"
        dx.pow(2).sum().backward()
        results.append([dx.detach(), *(p.grad.clone() for p in model.parameters())])
    for a, e in zip(results[1], results[0]):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("module", [moglm.LSTM, moglm.MultiplicativeLSTM])
def test_the_two_bias_gradients_are_separate_tensors(module):
    """Equal values, separate buffers: clipping or an optimizer that changes one in place leaves the other."""
    model = module(M, H, backend="fused", dtype=D)
    model(torch.randn(T, B, M, dtype=D))[0].sum().backward()
    torch.testing.assert_close(model.bias_ih_l0.grad, model.bias_hh_l0.grad)
    assert model.bias_ih_l0.grad.data_ptr() != model.bias_hh_l0.grad.data_ptr()


def test_backward_twice_with_retain_graph_gives_the_same_gradients():
    model = moglm.MogrifierLSTM(M, H, rounds=4, rank=2, state_dropout=0.3, backend="fused", dtype=D).train()
    y, (h, c) = model(torch.randn(T, B, M, dtype=D))
    loss = y.pow(2).sum() + c.sum()
    loss.backward(retain_graph=True)
    first = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    loss.backward()
    for a, b in zip(first, model.parameters()):
        assert torch.equal(a, b.grad)


def saved_bytes(model, steps):
    """Bytes of the distinct tensors autograd keeps for backward (parameters excluded)."""
    params = {p.data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        if t.data_ptr() not in params:
            seen[t.data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(torch.randn(steps, B, M))
    return sum(seen.values())


@pytest.mark.parametrize(
    "make",
    [lambda: moglm.MogrifierLSTM(M, H, rounds=5, rank=2, backend="fused"),
     lambda: moglm.MultiplicativeLSTM(M, H, backend="fused")],
    ids=["mogrifier", "multiplicative_lstm"],
)
def test_saved_activation_memory_grows_linearly_in_the_window(make):
    model = make()
    small, large = saved_bytes(model, 20), saved_bytes(model, 40)
    assert 1.8 < large / small < 2.1


def assert_edge_cases_match_reference(steps, batch, backend):
    """One step, one row, some frozen weights, an input without grad: ``backend`` against the reference."""
    model = moglm.MogrifierLSTM(M, H, 2, rounds=3, rank=2, state_dropout=0.3, dtype=D).train()
    model.weight_hh_l0.requires_grad_(False)
    model.mogrifier_q_left_l1.requires_grad_(False)
    x = torch.randn(steps, batch, M, dtype=D)  # no grad
    results = []
    for backend in ("reference", backend):
        model.backend = backend
        model.zero_grad()
        torch.manual_seed(4)
        y, (h, c) = model(x)
        (y.sum() + c.pow(2).sum()).backward()
        results.append([y, h, c, *(p.grad for p in model.parameters())])
    for a, e in zip(*reversed(results)):
        assert (a is None) == (e is None)
        if a is not None:
            torch.testing.assert_close(a, e)


@pytest.mark.parametrize("steps, batch", [(1, 3), (4, 1)])
def test_edge_cases_one_step_one_row_frozen_weights_and_input_without_grad(steps, batch):
    assert_edge_cases_match_reference(steps, batch, "fused")
