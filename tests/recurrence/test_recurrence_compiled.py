"""The compiled (C++, CPU) recurrence against the reference loop: outputs, final states and every gradient,
on one thread and batch-parallel, on every GEMM route; what ``auto`` picks, and the fallback when the
extension cannot be built (in subprocesses, so the build state of this process is left alone)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import moglm
from moglm.recurrence import compiled, fallback
from moglm.recurrence.compiled import build, functions, routes
from test_recurrence_fused import (
    MOGRIFIER_IDS,
    MOGRIFIERS,
    OPTIONS,
    TWO_LAYER_IDS,
    TWO_LAYER_MODELS,
    B,
    D,
    H,
    M,
    T,
    assert_double_backward_matches_reference,
    assert_edge_cases_match_reference,
    assert_forward_only_equals_training,
    assert_mogrifier_parity_over_options,
    assert_parity,
    assert_parity_in_1_and_2_layers,
    run_backend,
    saved_bytes,
)


@pytest.fixture(autouse=True)
def _machine_routes_after():
    """A test that forces a route (``MOGLM_GEMM_ROUTE``) leaves none behind: the process reads the machine's anew."""
    yield
    routes.forget()


@pytest.fixture
def built():
    """Skip where the extension cannot be built here (no compiler, MOGLM_COMPILED=0); builds it on first use."""
    if not compiled.available():
        pytest.skip(f"compiled recurrence unavailable: {compiled.unavailable_reason()}")


def on_two_threads(run):
    def wrapped(*args, **kwargs):
        threads = torch.get_num_threads()
        torch.set_num_threads(2)
        try:
            return run(*args, **kwargs)
        finally:
            torch.set_num_threads(threads)

    return staticmethod(wrapped)


@pytest.fixture
def batch_parallel(built, monkeypatch):
    """The compiled windows split the batch into blocks of as little as one row, over two threads. Only they
    run on two threads (conftest sets one): torch's own small ops crawl on two threads of a busy machine."""
    monkeypatch.setattr(functions, "MIN_ROWS", 1)
    for function in (compiled.CompiledLSTMFunction, compiled.CompiledMultiplicativeLSTMFunction):
        for name in ("run_forward", "run_backward"):
            monkeypatch.setattr(function, name, on_two_threads(getattr(function, name)))


@pytest.mark.usefixtures("built")
@pytest.mark.parametrize("rounds, rank, zigzag", MOGRIFIERS, ids=MOGRIFIER_IDS)
def test_compiled_mogrifier_matches_reference_outputs_states_and_all_gradients(rounds, rank, zigzag):
    assert_mogrifier_parity_over_options(rounds, rank, zigzag, "compiled")


@pytest.mark.usefixtures("built")
@pytest.mark.parametrize("capped, bias, state_dropout", OPTIONS)
@pytest.mark.parametrize("module", [moglm.LSTM, moglm.MultiplicativeLSTM])
def test_compiled_lstm_and_multiplicative_lstm_match_reference(module, capped, bias, state_dropout):
    assert_parity_in_1_and_2_layers(module, capped, bias, state_dropout, "compiled")


PARALLEL_MODELS = [
    lambda **kw: moglm.MogrifierLSTM(M, H, 2, rounds=5, rank=2, state_dropout=0.3, dropout=0.2, **kw),
    lambda **kw: moglm.MogrifierLSTM(M, H, 1, rounds=4, rank=0, zigzag=False, capped_input_gate=True, **kw),
    lambda **kw: moglm.LSTM(M, H, 2, state_dropout=0.3, dropout=0.2, **kw),
    lambda **kw: moglm.MultiplicativeLSTM(M, H, 2, state_dropout=0.3, capped_input_gate=True, **kw),
]
PARALLEL_IDS = ["mogrifier", "mogrifier_full_no_zigzag", "lstm", "multiplicative_lstm"]


@pytest.mark.usefixtures("batch_parallel")
@pytest.mark.parametrize("batch", [5, 37])
@pytest.mark.parametrize("make", PARALLEL_MODELS, ids=PARALLEL_IDS)
def test_batch_parallel_rows_split_across_threads_match_reference_in_float64(make, batch):
    model = make(dtype=D).train()
    assert_parity(model, model.num_layers, backend="compiled", batch=batch)
    x = torch.randn(T, batch, M, dtype=D)
    y_saving, _ = model.eval()(x)  # the autograd function: the forward saves what backward needs
    with torch.no_grad():
        y_free, _ = model(x)  # forward only (nothing saved), split across threads as well
    torch.testing.assert_close(y_free, y_saving.detach(), rtol=1e-12, atol=1e-12)


@pytest.mark.usefixtures("batch_parallel")
@pytest.mark.parametrize("route", list(compiled.ROUTES))
@pytest.mark.parametrize("make", PARALLEL_MODELS, ids=PARALLEL_IDS)
def test_float32_on_every_gemm_route_batch_parallel_matches_reference(make, route, monkeypatch):
    """MOGLM_GEMM_ROUTE forces the route (checked); each is compared where this machine has it."""
    if route not in compiled.candidate_routes(torch.float32):
        pytest.skip(f"GEMM route {route!r} not available here")
    force_route(monkeypatch, route)
    assert compiled.gemm_route(torch.float32) == compiled.ROUTES[route]
    model = make().train()
    assert_parity(model, model.num_layers, dtype=torch.float32, backend="compiled", batch=37, rtol=1e-4, atol=1e-5)


#: sizes at which the brgemm route takes its own paths: per-step products packed (T times each thread's
#: rows >= 64), panels of 64 columns with a narrower last one (4H = 284), products over all T*B rows in row
#: blocks of 64 with a shorter last one (T*B = 555), weight gradients with either operand transposed
#: (N > K and N < K) accumulating over chunks of 512 rows with a shorter last one, rank-64 rounds
WIDE_M, WIDE_H, WIDE_T, WIDE_B = 67, 71, 15, 37
WIDE_MODELS = [
    lambda **kw: moglm.MogrifierLSTM(WIDE_M, WIDE_H, 2, rounds=5, rank=64, state_dropout=0.3, dropout=0.2, **kw),
    lambda **kw: moglm.MogrifierLSTM(WIDE_M, WIDE_H, 1, rounds=2, rank=0, **kw),
    lambda **kw: moglm.LSTM(WIDE_M, WIDE_H, 2, state_dropout=0.3, **kw),
    lambda **kw: moglm.MultiplicativeLSTM(WIDE_M, WIDE_H, 2, state_dropout=0.3, capped_input_gate=True, **kw),
]


@pytest.mark.usefixtures("batch_parallel")
@pytest.mark.parametrize("weight_gradients", ["brgemm", "aten"])
@pytest.mark.parametrize("make", WIDE_MODELS, ids=["mogrifier_k64", "mogrifier_full", "lstm", "multiplicative_lstm"])
def test_brgemm_route_at_panel_and_row_block_sizes_matches_reference(make, weight_gradients, monkeypatch):
    """float32 on oneDNN's ukernel (it has no float64) against the float32 reference loop, with the weight
    gradients after the loop on the ukernel too or on at::mm (which of the two runs is probed per machine)."""
    if "brgemm" not in compiled.candidate_routes(torch.float32):
        pytest.skip("this torch exports no float32 brgemm")
    force_route(monkeypatch, "brgemm")
    monkeypatch.setattr(routes, "weight_gradient_route", lambda dtype: routes.ROUTES[weight_gradients])
    torch.manual_seed(0)
    model = make().train()
    layers = model.num_layers
    x = torch.randn(WIDE_T, WIDE_B, WIDE_M)
    state = tuple(torch.randn(layers, WIDE_B, WIDE_H) for _ in range(2))
    actual = run_backend(model, "compiled", x, state)
    expected = run_backend(model, "reference", x, state)
    names = ["y", "h_n", "c_n", "d input", "d h0", "d c0", *(f"d {n}" for n, _ in model.named_parameters())]
    for name, a, e in zip(names, actual, expected, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=2e-5, msg=lambda m: f"{name}: {m}")


@pytest.mark.usefixtures("batch_parallel")
def test_rank_64_round_gradients_shared_out_by_columns_on_the_ukernel_match_reference(monkeypatch):
    """A rank-64 round's factor gradients after the loop are one block of 64 output rows, so the two threads
    share out their blocks of 128 columns instead (261 units: three blocks, the last of 5 columns; the x side's
    67 columns: one block, on one thread as before); float32 against the float32 reference loop."""
    if "brgemm" not in compiled.candidate_routes(torch.float32):
        pytest.skip("this torch exports no float32 brgemm")
    force_route(monkeypatch, "brgemm")
    monkeypatch.setattr(routes, "weight_gradient_route", lambda dtype: routes.ROUTES["brgemm"])
    torch.manual_seed(0)
    hidden = 261
    model = moglm.MogrifierLSTM(WIDE_M, hidden, 1, rounds=5, rank=64).train()
    x = torch.randn(WIDE_T, WIDE_B, WIDE_M)
    state = tuple(torch.randn(1, WIDE_B, hidden) for _ in range(2))
    actual = run_backend(model, "compiled", x, state)
    expected = run_backend(model, "reference", x, state)
    names = ["y", "h_n", "c_n", "d input", "d h0", "d c0", *(f"d {n}" for n, _ in model.named_parameters())]
    assert any(n.startswith("d mogrifier_q_right") for n in names)
    for name, a, e in zip(names, actual, expected, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=2e-5, msg=lambda m: f"{name}: {m}")


@pytest.mark.usefixtures("batch_parallel")
def test_large_per_step_products_summed_in_chunks_match_reference_and_round_differently(monkeypatch):
    """Split by columns at 800 units, the backward's per-step products read dG [64, 3200]: 819 KB, over the
    768 KiB from which the ukernel's products sum in chunks of 256 KiB (1024, 1024, 1024 and 128 of its columns). With
    the chunks (the default) and summed whole, float32 against the float32 reference loop; the two must round
    differently, or the chunks did not run."""
    if "brgemm" not in compiled.candidate_routes(torch.float32):
        pytest.skip("this torch exports no float32 brgemm")
    force_route(monkeypatch, "brgemm+columns")
    torch.manual_seed(0)
    hidden, batch = 800, 64
    model = moglm.MogrifierLSTM(64, hidden, 1, rounds=5, rank=64).train()
    x = torch.randn(3, batch, 64)
    state = tuple(torch.randn(1, batch, hidden) for _ in range(2))
    assert compiled.blocks_products()
    chunked = run_backend(model, "compiled", x, state)
    with compiled.blocked_products(False):
        assert not compiled.blocks_products() and not compiled.info(paths=False)["blocked_products"]
        whole = run_backend(model, "compiled", x, state)
    assert compiled.blocks_products()  # the switch is back as it was
    expected = run_backend(model, "reference", x, state)
    names = ["y", "h_n", "c_n", "d input", "d h0", "d c0", *(f"d {n}" for n, _ in model.named_parameters())]
    for name, a, b, e in zip(names, chunked, whole, expected, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=2e-5, msg=lambda m: f"{name}, in chunks: {m}")
        torch.testing.assert_close(b, e, rtol=1e-4, atol=2e-5, msg=lambda m: f"{name}, whole: {m}")
    assert not torch.equal(chunked[3], whole[3])  # the input's gradient: through the chunked products


#: sizes at which the column split runs: 37 units over two threads (blocks of 16 and 21), and 261 (blocks
#: on 64-wide panels: 128 and 133); batches of 1 (a thread with no rows in the rounds' phase), 5 and 37
COLUMN_M, COLUMN_H, COLUMN_T = 19, 37, 6
COLUMN_MODELS = [
    lambda h, **kw: moglm.MogrifierLSTM(COLUMN_M, h, 2, rounds=5, rank=3, state_dropout=0.3, dropout=0.2, **kw),
    lambda h, **kw: moglm.MogrifierLSTM(COLUMN_M, h, 1, rounds=4, rank=0, zigzag=False, capped_input_gate=True,
                                        bias=False, **kw),
    lambda h, **kw: moglm.LSTM(COLUMN_M, h, 2, state_dropout=0.3, dropout=0.2, **kw),
    lambda h, **kw: moglm.LSTM(COLUMN_M, h, 1, capped_input_gate=True, bias=False, **kw),
    lambda h, **kw: moglm.MultiplicativeLSTM(COLUMN_M, h, 2, state_dropout=0.3, dropout=0.2, **kw),
    lambda h, **kw: moglm.MultiplicativeLSTM(COLUMN_M, h, 1, capped_input_gate=True, bias=False, **kw),
]
COLUMN_IDS = ["mogrifier_k3", "mogrifier_full_no_zigzag_capped", "lstm_dropout", "lstm_capped_no_bias",
              "multiplicative_lstm_dropout", "multiplicative_lstm_capped_no_bias"]


def assert_matches_reference(model, hidden, batch, dtype, **tol):
    """The compiled window against the reference loop on one random window: outputs, final states and every
    gradient (the input's, the initial state's, every weight's)."""
    layers = model.num_layers
    x = torch.randn(COLUMN_T, batch, COLUMN_M, dtype=dtype)
    state = tuple(torch.randn(layers, batch, hidden, dtype=dtype) for _ in range(2))
    actual = run_backend(model, "compiled", x, state)
    expected = run_backend(model, "reference", x, state)
    names = ["y", "h_n", "c_n", "d input", "d h0", "d c0", *(f"d {n}" for n, _ in model.named_parameters())]
    for name, a, e in zip(names, actual, expected, strict=True):
        assert a is not None and e is not None, name
        torch.testing.assert_close(a, e, **tol, msg=lambda m: f"{name}: {m}")


def force_route(monkeypatch, route: str) -> None:
    """``MOGLM_GEMM_ROUTE=route``, read anew (``_machine_routes_after`` forgets it after the test)."""
    monkeypatch.setenv("MOGLM_GEMM_ROUTE", route)
    routes.forget()


@pytest.mark.usefixtures("batch_parallel")
@pytest.mark.parametrize("route", ["aten+columns", "blas+columns:aten"])
@pytest.mark.parametrize("batch", [1, 5, 37])
@pytest.mark.parametrize("make", COLUMN_MODELS, ids=COLUMN_IDS)
def test_column_split_window_matches_reference_in_float64_with_every_gradient(make, batch, route, monkeypatch):
    if "blas" not in compiled.candidate_routes(torch.float64):
        pytest.skip("this torch exports no BLAS")
    force_route(monkeypatch, route)
    assert compiled.gemm_route(torch.float64) == compiled.route_code(route)
    assert on_two_threads(torch.ops.moglm.column_partitions)(COLUMN_H) == 2, "the split would not run here"
    torch.manual_seed(batch)
    model = make(COLUMN_H, dtype=D).train()
    assert_matches_reference(model, COLUMN_H, batch, D, rtol=1e-10, atol=1e-10)
    x = torch.randn(COLUMN_T, batch, COLUMN_M, dtype=D)
    y_saving, _ = model.eval()(x)  # the forward that saves for backward
    with torch.no_grad():
        y_free, _ = model(x)  # forward only, nothing saved: one slot reused by every step
    torch.testing.assert_close(y_free, y_saving.detach(), rtol=1e-12, atol=1e-12)


@pytest.mark.usefixtures("batch_parallel")
@pytest.mark.parametrize("hidden", [COLUMN_H, 261])
@pytest.mark.parametrize("route", list(compiled.ROUTES))
@pytest.mark.parametrize("make", COLUMN_MODELS[:1] + COLUMN_MODELS[2:3] + COLUMN_MODELS[4:5],
                         ids=["mogrifier", "lstm", "multiplicative_lstm"])
def test_column_split_on_every_route_in_float32_matches_reference(make, route, hidden, monkeypatch):
    if route not in compiled.candidate_routes(torch.float32):
        pytest.skip(f"GEMM route {route!r} not available here")
    force_route(monkeypatch, route + compiled.COLUMNS_SUFFIX)
    assert compiled.gemm_route(torch.float32) == compiled.ROUTES[route] | compiled.COLUMNS
    torch.manual_seed(0)
    assert_matches_reference(make(hidden).train(), hidden, 37, torch.float32, rtol=1e-4, atol=2e-5)


COLUMN_THREADS_SCRIPT = """
import json, math, torch, moglm
torch.set_num_threads(4)
out = {"partitions": torch.ops.moglm.column_partitions(67) if moglm.recurrence.compiled.available() else 0,
       "max_difference": 0.0}
for make in (lambda: moglm.MogrifierLSTM(19, 67, rounds=3, rank=5, state_dropout=0.3, dtype=torch.float64),
             lambda: moglm.MultiplicativeLSTM(19, 67, state_dropout=0.3, dtype=torch.float64)):
    torch.manual_seed(0)
    model = make().train()
    x = torch.randn(5, 7, 19, dtype=torch.float64, requires_grad=True)
    grads = []
    for backend in ("compiled", "reference"):
        model.backend = backend
        torch.manual_seed(1)  # the same state-dropout mask
        y, (h, c) = model(x)
        (y.sum() + h.sum() + c.sum()).backward()
        grads.append([y.detach(), x.grad.clone()] + [p.grad.clone() for p in model.parameters()])
        x.grad = None
        model.zero_grad(set_to_none=True)
    # NaN counts as infinitely far (Python's max() would skip it)
    out["max_difference"] = max(out["max_difference"], *(torch.nan_to_num((a - b).abs(), nan=math.inf).max().item()
                                                          for a, b in zip(*grads)))
print(json.dumps(out))
"""


@pytest.mark.usefixtures("built")
@pytest.mark.parametrize("thread_limit", ["2", "4"], ids=["fewer_threads_than_partitions", "four_threads"])
@pytest.mark.slow
def test_column_split_over_four_partitions_matches_reference_on_any_number_of_threads(thread_limit):
    """Four partitions (67 units, four threads asked), run by four threads or, with OMP_THREAD_LIMIT=2, by
    two threads that each run two partitions and count for both at every barrier (in a fresh process: the
    OpenMP limit is read at start)."""
    env = {**os.environ, "OMP_NUM_THREADS": "4", "OMP_THREAD_LIMIT": thread_limit,
           "MOGLM_GEMM_ROUTE": "aten+columns", "MOGLM_AUTO_BACKEND": "compiled"}
    done = subprocess.run([sys.executable, "-c", COLUMN_THREADS_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["partitions"] == 4 and report["max_difference"] < 1e-10, report


@pytest.mark.usefixtures("batch_parallel")
@pytest.mark.parametrize("route", ["aten:blas", "blas:aten"])
def test_the_rounds_on_their_own_route_match_reference_in_float64(route, monkeypatch):
    """The Mogrifier's round products on another route than its gate products (``gates:rounds``), by rows."""
    if "blas" not in compiled.candidate_routes(torch.float64):
        pytest.skip("this torch exports no BLAS")
    force_route(monkeypatch, route)
    torch.manual_seed(0)
    model = COLUMN_MODELS[0](COLUMN_H, dtype=D).train()
    assert_matches_reference(model, COLUMN_H, 5, D, rtol=1e-10, atol=1e-10)


@pytest.mark.usefixtures("built")
def test_info_names_a_forced_route_with_the_column_split_and_the_rounds_route(monkeypatch):
    if not {"blas", "brgemm"} <= set(compiled.candidate_routes(torch.float32)):
        pytest.skip("this torch exports no BLAS or no float32 brgemm")
    force_route(monkeypatch, "blas+columns:brgemm")
    assert compiled.info(paths=False)["gemm_route"] == "blas+columns:brgemm"


def test_route_names_and_codes_round_trip_and_unknown_names_are_not_routes():
    for name in ["aten", "brgemm+columns", "mkl_packed+columns:brgemm", "panels:aten"]:
        assert compiled.route_name(compiled.route_code(name)) == name
        assert compiled.stored_route(name) == compiled.route_code(name)
    assert compiled.route_code("blas+columns:brgemm") == (compiled.ROUTES["blas"] | compiled.COLUMNS
                                                          | (compiled.ROUTES["brgemm"] + 1) << 4)
    assert compiled.stored_route("cublas") is None and compiled.stored_route("aten:cublas") is None
    assert compiled.stored_route(None) is None


@pytest.mark.usefixtures("built")
def test_the_weight_gradient_route_is_probed_once_per_machine_and_forced_with_the_gemm_route(monkeypatch, tmp_path):
    """oneDNN's ukernel or at::mm for the products over all T*B rows, whichever this CPU runs faster (the
    ukernel wins on a Zen 4, MKL on an Intel Xeon): probed and stored beside the library, then read."""
    if "brgemm" not in compiled.candidate_routes(torch.float32):
        pytest.skip("this torch exports no float32 brgemm: at::mm is the only weight-gradient route")
    monkeypatch.delenv("MOGLM_GEMM_ROUTE", raising=False)
    monkeypatch.setattr(routes, "route_file", lambda dtype, kind="gemm_route": tmp_path / f"{kind}.json")
    routes.forget()
    monkeypatch.setattr(routes, "_probe_weight_gradients",
                        lambda dtype, candidates: {"aten": 2.0, "brgemm": 1.0})
    assert compiled.weight_gradient_route(torch.float32) == compiled.ROUTES["brgemm"]
    assert json.loads((tmp_path / "weight_gradient_route.json").read_text())["route"] == "brgemm"
    monkeypatch.setattr(routes, "_probe_weight_gradients", lambda *a: pytest.fail("probed although stored"))
    routes.forget()
    assert compiled.weight_gradient_route(torch.float32) == compiled.ROUTES["brgemm"]
    for forced, route in (("aten", "aten"), ("panels", "aten"), ("brgemm", "brgemm")):
        monkeypatch.setenv("MOGLM_GEMM_ROUTE", forced)
        routes.forget()
        assert compiled.weight_gradient_route(torch.float32) == compiled.ROUTES[route]


@pytest.mark.usefixtures("built")
def test_the_weight_gradient_probes_timings_are_none_under_a_pin_that_skipped_the_probe(monkeypatch, tmp_path):
    """Under a pin (a compressed file's decoding) nothing is probed, and asking for the probe's timings (as ``moglm
    info`` and the benchmarks do) answers that there are none instead of failing."""
    monkeypatch.setattr(routes, "route_file", lambda dtype, kind="gemm_route": tmp_path / f"{kind}.json")
    monkeypatch.setattr(routes, "_probe_weight_gradients", lambda *a: pytest.fail("probed under a pin"))
    routes.forget()
    with routes.pinned_weight_gradient_route("aten"):
        assert routes.probe_seconds(torch.float32, "weight_gradient_route") == {}
    routes.forget()


@pytest.mark.usefixtures("built")
@pytest.mark.parametrize("make", TWO_LAYER_MODELS, ids=TWO_LAYER_IDS)
def test_compiled_forward_only_evaluation_equals_the_training_forward(make):
    assert_forward_only_equals_training(make, "compiled")


@pytest.mark.usefixtures("built")
@pytest.mark.parametrize("rounds, rank", [(1, 0), (2, 3), (4, 0), (5, 3)])
@pytest.mark.parametrize("state_dropout", [0.0, 0.4])
def test_a_forward_only_window_cut_from_one_block_equals_the_reference_loop(rounds, rank, state_dropout):
    """Forward-only, the window cuts its buffers (gates, [x; h], h~, the chains' links, the rounds' sigmoids and
    low-rank products) from one block: at every rounds count (x's chain only, both, uneven), full and low rank,
    with a state-dropout mask (h~ kept apart) and without, over odd sizes and several steps, it gives the
    reference loop's outputs and final state."""
    torch.manual_seed(0)
    model = moglm.MogrifierLSTM(7, 5, 2, rounds=rounds, rank=rank, state_dropout=state_dropout, dtype=D).train()
    x = torch.randn(4, 3, 7, dtype=D)  # [T, B, m]
    state = tuple(torch.randn(2, 3, 5, dtype=D) for _ in range(2))
    out = {}
    for backend in ("compiled", "reference"):
        model.backend = backend
        torch.manual_seed(1)  # the same masks
        with torch.no_grad():
            y, (h, c) = model(x, state)
        out[backend] = (y, h, c)
    for actual, expected in zip(out["compiled"], out["reference"], strict=True):
        torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.usefixtures("built")
def test_gemm_route_probe_does_not_consume_torchs_global_rng(monkeypatch, tmp_path):
    routes.forget()
    monkeypatch.setattr(routes, "route_file", lambda dtype, kind="gemm_route": tmp_path / f"{kind}{dtype}.json")
    monkeypatch.delenv("MOGLM_GEMM_ROUTE", raising=False)
    before = torch.get_rng_state()
    for dtype in (torch.float32, torch.float64):
        route = compiled.gemm_route(dtype)
        candidates = compiled.candidate_routes(dtype)
        assert route in [compiled.ROUTES[c] for c in candidates]
        timings = routes.probe_seconds(dtype)
        assert len(candidates) == 1 or set(timings) == set(candidates)  # the probe ran
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.usefixtures("built")
def test_the_probed_route_is_stored_once_per_machine_and_every_later_process_uses_it(monkeypatch, tmp_path):
    """Routes round differently, so all processes on a machine must agree (a resumed run continues bit for
    bit): the first probe is stored, later lookups read it without probing, a racing probe never
    overwrites it, and a corrupt file is probed again and replaced."""
    monkeypatch.delenv("MOGLM_GEMM_ROUTE", raising=False)
    monkeypatch.setattr(routes, "route_file", lambda dtype, kind="gemm_route": tmp_path / "route.json")
    routes.forget()
    first = compiled.gemm_route(torch.float32)
    assert json.loads((tmp_path / "route.json").read_text())["route"] == {v: k for k, v in compiled.ROUTES.items()}[first]

    def no_probe(*args):
        raise AssertionError("probed although a route is stored")

    monkeypatch.setattr(routes, "_probe", no_probe)
    routes.forget()
    assert compiled.gemm_route(torch.float32) == first
    other = next(r for r in compiled.candidate_routes(torch.float32) if compiled.ROUTES[r] != first)
    routes._store_first(tmp_path / "route.json", json.dumps({"route": other, "seconds": {}}))  # a racing process
    routes.forget()
    assert compiled.gemm_route(torch.float32) == first
    (tmp_path / "route.json").write_text("{not json")
    monkeypatch.setattr(routes, "_probe", lambda dtype, candidates: {c: float(c != other) for c in candidates})
    routes.forget()
    assert compiled.gemm_route(torch.float32) == compiled.ROUTES[other]
    assert json.loads((tmp_path / "route.json").read_text())["route"] == other


@pytest.mark.usefixtures("built")
@pytest.mark.parametrize("make", TWO_LAYER_MODELS, ids=TWO_LAYER_IDS)
def test_auto_runs_the_compiled_path_on_cpu_float32(make):
    model = make()  # backend="auto", float32
    y, _ = model(torch.randn(T, B, M))
    assert "Compiled" in type(y.grad_fn).__name__


@pytest.mark.usefixtures("built")
def test_compiled_backend_refuses_non_cpu_devices_and_other_dtypes_saying_why():
    meta = moglm.LSTM(M, H, device="meta", backend="compiled")
    with pytest.raises(ValueError, match="compiled.*CPU only"):
        meta(torch.empty(T, B, M, device="meta"))
    half = moglm.MogrifierLSTM(M, H, rounds=2, rank=2, dtype=torch.bfloat16, backend="compiled")
    with pytest.raises(ValueError, match="float32 or float64"):
        half(torch.randn(T, B, M, dtype=torch.bfloat16))


@pytest.mark.usefixtures("built")
@pytest.mark.parametrize(
    "make",
    [lambda: moglm.MogrifierLSTM(M, H, 2, rounds=3, rank=2, dtype=D), lambda: moglm.MultiplicativeLSTM(M, H, 2, dtype=D)],
    ids=["mogrifier", "multiplicative_lstm"],
)
def test_compiled_double_backward_matches_reference(make, monkeypatch):
    monkeypatch.setattr(fallback, "_warned", set())
    assert_double_backward_matches_reference(make(), "compiled")


@pytest.mark.usefixtures("built")
@pytest.mark.parametrize("steps, batch", [(1, 3), (4, 1)])
def test_compiled_edge_cases_one_step_one_row_frozen_weights_and_input_without_grad(steps, batch):
    assert_edge_cases_match_reference(steps, batch, "compiled")


@pytest.mark.usefixtures("built")
def test_panel_kernel_with_more_rows_than_one_pass_takes_matches_reference(monkeypatch):
    """The panel kernel takes at most 6 x 64 rows per pass; a thread with more runs it in slices."""
    monkeypatch.setenv("MOGLM_GEMM_ROUTE", "panels")
    routes.forget()
    for make in (lambda: moglm.MogrifierLSTM(M, H, 1, rounds=2, rank=2), lambda: moglm.MultiplicativeLSTM(M, H, 1)):
        model = make().train()
        # weight gradients sum T * 401 = 2406 float32 products: atol scaled to that reduction
        assert_parity(model, 1, dtype=torch.float32, backend="compiled", batch=401, rtol=1e-4, atol=1e-4)
    assert compiled.gemm_route(torch.float32) == compiled.ROUTES["panels"]


@pytest.mark.usefixtures("built")
@pytest.mark.parametrize("make", [lambda **kw: moglm.LSTM(64, 64, **kw),
                                  lambda **kw: moglm.MogrifierLSTM(64, 64, rounds=5, rank=8, capped_input_gate=True, **kw)],
                         ids=["lstm", "mogrifier"])
def test_float32_compiled_math_is_as_accurate_as_torchs_own_float32(make):
    """The compiled window's float32 exp is a polynomial (no libm call): against a float64 reference, its
    error stays within twice that of torch's own float32 ops running the reference loop."""
    torch.manual_seed(0)
    model = make(backend="compiled")
    exact = make(backend="reference", dtype=torch.float64)
    exact.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    x = 3 * torch.randn(20, 16, 64)  # large pre-activations: saturated and central gates alike
    with torch.no_grad():
        truth = exact(x.double())[0]
        compiled_error = (model(x)[0].double() - truth).abs().max()
        model.backend = "reference"
        torch_error = (model(x)[0].double() - truth).abs().max()
    assert compiled_error <= 2 * torch_error + 1e-7


@pytest.mark.usefixtures("built")
@pytest.mark.parametrize(
    "make",
    [lambda: moglm.MogrifierLSTM(M, H, rounds=5, rank=2, backend="compiled"),
     lambda: moglm.LSTM(M, H, state_dropout=0.3, backend="compiled"),
     lambda: moglm.MultiplicativeLSTM(M, H, backend="compiled")],
    ids=["mogrifier", "lstm", "multiplicative_lstm"],
)
def test_compiled_saved_activation_memory_grows_linearly_in_the_window(make):
    model = make()
    small, large = saved_bytes(model, 20), saved_bytes(model, 40)
    assert 1.8 < large / small < 2.1


ADAPTED = [
    lambda: moglm.MogrifierLSTM(M, H, 2, rounds=5, rank=2, state_dropout=0.3, capped_input_gate=True, dtype=D),
    lambda: moglm.LSTM(M, H, 2, state_dropout=0.3, dtype=D),
    lambda: moglm.MultiplicativeLSTM(M, H, 2, dtype=D),
]


@pytest.mark.parametrize("per_row", [False, True], ids=["shared_M", "M_per_row"])
@pytest.mark.parametrize("make", ADAPTED, ids=["mogrifier", "lstm", "multiplicative_lstm"])
def test_sparse_dynamic_evaluation_adaptation_in_the_compiled_window_matches_the_reference_wrapper(
    make, per_row, batch_parallel
):
    """Krause's eq. 4.8, h_U <- h_U + M h_U after every step (the AdaptedCell wrapper of sparse dynamic
    evaluation): the compiled window applies it inside its loop; outputs, states and the gradients of M,
    the input, the initial state and every parameter equal the reference loop over the wrapper's step."""
    from moglm.dynamic_evaluation.sparse import AdaptedCell

    model = make().train()
    units, batch = 3, 5
    gen = torch.Generator().manual_seed(5)
    shape = (batch, units, units) if per_row else (units, units)
    matrices = [(0.3 * torch.randn(shape, generator=gen, dtype=D)).requires_grad_() for _ in model.cells]
    model.cells = [AdaptedCell(cell, m) for cell, m in zip(model.cells, matrices)]
    x = torch.randn(T, batch, M, dtype=D)
    state = (torch.randn(2, batch, H, dtype=D), torch.randn(2, batch, H, dtype=D))
    results = []
    for backend in ("reference", "auto"):
        for m in matrices:
            m.grad = None
        out = run_backend(model, backend, x, state)
        results.append([*out, *(m.grad.clone() for m in matrices)])
    assert "Compiled" in type(out[0].grad_fn).__name__  # the auto run
    for expected, actual in zip(*results):
        torch.testing.assert_close(actual, expected)


@pytest.mark.usefixtures("built")
def test_an_adaptation_matrix_of_the_wrong_batch_is_refused_with_the_shapes_not_read_out_of_bounds():
    from moglm.dynamic_evaluation.sparse import AdaptedCell

    model = moglm.LSTM(M, H, dtype=D)
    model.cells = [AdaptedCell(model.cells[0], torch.zeros(7, 3, 3, dtype=D))]  # 7 rows of M, batch 5
    with pytest.raises(RuntimeError, match="batch|size|shape|match"):
        model(torch.randn(T, 5, M, dtype=D))


@pytest.mark.usefixtures("built")
def test_the_compiled_ops_refuse_wrong_shapes_with_a_message_instead_of_reading_out_of_bounds():
    xs, h0, c0 = torch.randn(T, B, M), torch.randn(B, H), torch.randn(B, H)
    w_ih, w_hh = torch.randn(4 * H, M), torch.randn(4 * H, H)
    op = torch.ops.moglm.mogrifier_lstm_forward
    route = compiled.gemm_route(torch.float32)
    with pytest.raises(RuntimeError, match="state-dropout mask must be"):
        op(xs, h0, c0, torch.ones(B + 1, H), w_ih, w_hh, None, [], [], [], 0, 0, True, False, False, route, 8)
    with pytest.raises(RuntimeError, match="weight_hh must be"):
        op(xs, h0, c0, None, w_ih, w_hh[:, :-1].contiguous(), None, [], [], [], 0, 0, True, False, False, route, 8)
    with pytest.raises(RuntimeError, match="round 1's matrix must be"):
        op(xs, h0, c0, None, w_ih, w_hh, None, [torch.randn(2, M)], [torch.randn(M, 2)], [], 1, 2, True, False, False,
           route, 8)
    with pytest.raises(RuntimeError, match="weight_mx must be"):
        torch.ops.moglm.multiplicative_lstm_forward(xs, h0, c0, None, w_ih, torch.randn(4 * H, H), None,
                                                    torch.randn(H, M + 1), torch.randn(H, H), False, False, route, 8)


FALLBACK_SCRIPT = """
import json, math, warnings
import torch, moglm
from moglm.recurrence import compiled

torch.manual_seed(0)
model = moglm.MogrifierLSTM(7, 5, 2, rounds=3, rank=2, state_dropout=0.3)
x = torch.randn(6, 3, 7)


def run():
    torch.manual_seed(1)  # the same state-dropout masks every time
    return model(x)[0]


with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")  # so that "once" is moglm's doing, not Python's warning filter
    ys = [run() for _ in range(3)]
model.backend = "reference"
reference = run()
model.backend = "compiled"
try:
    run()
    refused = None
except ValueError as error:
    refused = str(error)
said = [w for w in caught if issubclass(w.category, compiled.CompiledUnavailableWarning)]
print(json.dumps({
    "available": compiled.available(),
    "reason": compiled.unavailable_reason(),
    "grad_fn": type(ys[0].grad_fn).__name__,
    "max_difference": max(torch.nan_to_num((y - reference).abs(), nan=math.inf).max().item() for y in ys),
    "categories": [w.category.__name__ for w in said],
    "messages": [str(w.message) for w in said],
    "refused": refused,
}))
"""


def run_fallback_script(**env):
    """Run FALLBACK_SCRIPT in a fresh interpreter with ``env`` added; its JSON report."""
    done = subprocess.run([sys.executable, "-c", FALLBACK_SCRIPT], env={**os.environ, "OMP_NUM_THREADS": "1", **env},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def assert_fell_back_to_fused_saying_why_once(report):
    assert not report["available"] and report["reason"]
    assert "Fused" in report["grad_fn"]  # the Python fused path ran
    assert report["max_difference"] < 1e-5  # ... and computed what the reference loop computes
    assert report["categories"] == ["CompiledUnavailableWarning"]  # said once, over three forwards
    assert report["reason"] in report["messages"][0] and "unavailable" in report["messages"][0]
    assert report["refused"] and report["reason"] in report["refused"]  # backend="compiled" says why too


def test_moglm_compiled_0_turns_it_off_and_auto_runs_the_fused_path_saying_why_once(tmp_path):
    report = run_fallback_script(MOGLM_COMPILED="0", MOGLM_EXTENSIONS_DIR=str(tmp_path))
    assert_fell_back_to_fused_saying_why_once(report)
    assert "MOGLM_COMPILED=0" in report["reason"]
    assert not any(tmp_path.iterdir())  # nothing was built


def test_a_failed_build_falls_back_to_the_fused_path_saying_why_once(tmp_path):
    """A fresh build directory (nothing cached) and a compiler that does not exist: the build really fails."""
    report = run_fallback_script(MOGLM_EXTENSIONS_DIR=str(tmp_path), CXX="/nonexistent-compiler")
    assert_fell_back_to_fused_saying_why_once(report)
    assert "MOGLM_COMPILED" not in report["reason"]
    assert "/nonexistent-compiler: not found" in report["reason"]  # the shell's reason, not ninja's command line
    assert not list(tmp_path.rglob("*.so"))


def test_a_failed_builds_reason_is_the_compilers_error_not_the_command_line_ninja_echoes(tmp_path):
    """A real failed build through torch's cpp_extension (a source without torch's headers: it fails fast)."""
    from torch.utils import cpp_extension

    (tmp_path / "broken.cpp").write_text("int f() { return undeclared_name_here; }\n")
    with pytest.raises(Exception) as failed:
        cpp_extension.load(name="moglm_broken", sources=[str(tmp_path / "broken.cpp")], build_directory=str(tmp_path),
                           is_python_module=False, verbose=False)
    reason = build.build_failure_reason(failed.value)
    assert "-MMD" in str(failed.value) and "-MMD" not in reason  # torch's message starts with the command line
    assert "broken.cpp:1:" in reason and "error:" in reason and "undeclared_name_here" in reason
    assert "moglm_broken" in reason and "\n" not in reason and len(reason) <= 300


def test_a_build_lock_left_by_a_killed_build_is_cleared_not_waited_for(tmp_path):
    """torch's ``lock`` file outlives a process killed mid-build; under moglm's flock it is stale and removed."""
    (tmp_path / "lock").touch()
    with build._build_lock(tmp_path):
        assert not (tmp_path / "lock").exists()


@pytest.mark.parametrize("built", [False, True])
def test_a_process_waiting_on_the_build_lock_says_so_only_when_a_build_is_under_way(tmp_path, capfd, built):
    """Another process holds the lock: while it builds, the waiting one says so; when the library is built
    already, the holder is only checking it, and nothing is said for that moment's wait."""
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom moglm.atomic import exclusive_lock\n"
                               f"with exclusive_lock({str(tmp_path / '.moglm-build')!r}):\n"
                               "    print('held', flush=True)\n    time.sleep(1.5)"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with build._build_lock(tmp_path, built):
        pass
    holder.wait()
    assert ("waiting for another process that is building" in capfd.readouterr().err) == (not built)


WORKSPACE_SCRIPT = """
import json, math, torch, moglm
from moglm.recurrence import compiled
from moglm.recurrence.compiled import routes
assert compiled.available(), compiled.unavailable_reason()
torch.set_num_threads(2)
D = torch.float64
models = {
    "mogrifier": lambda dt: moglm.MogrifierLSTM(19, 37, 2, rounds=5, rank=3, state_dropout=0.3, dropout=0.2, dtype=dt),
    "mogrifier_full_no_zigzag": lambda dt: moglm.MogrifierLSTM(19, 37, rounds=4, rank=0, zigzag=False,
                                                               capped_input_gate=True, dtype=dt),
    "lstm": lambda dt: moglm.LSTM(19, 37, 2, state_dropout=0.3, dropout=0.2, dtype=dt),
    "multiplicative_lstm": lambda dt: moglm.MultiplicativeLSTM(19, 37, 2, state_dropout=0.3, dtype=dt),
}

def run(model, backend, x, state):
    model.backend = backend
    model.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    state = tuple(s.clone().requires_grad_() for s in state)
    torch.manual_seed(1)
    y, (h, c) = model(x, state)
    g = torch.Generator().manual_seed(2)
    sum((t * torch.randn(t.shape, generator=g, dtype=t.dtype)).sum() for t in (y, h, c)).backward()
    return [y, h, c, x.grad, *(s.grad for s in state), *(p.grad for p in model.parameters())]

def forward_only(model, backend, x, state):
    model.backend = backend
    with torch.no_grad():
        return model.eval()(x, state)[0]

# oneDNN's products over all T * B rows need 64 of them (and 64 columns for the weight gradients): wider
# models, 11 rows a step
wide = {"mogrifier_wide": lambda dt: moglm.MogrifierLSTM(70, 67, rounds=5, rank=3, dtype=dt),
        "lstm_wide": lambda dt: moglm.LSTM(70, 67, dtype=dt),
        "multiplicative_lstm_wide": lambda dt: moglm.MultiplicativeLSTM(70, 67, dtype=dt)}
out = {}
for route, dtype, batch, makers in (("aten", D, 5, models), ("aten+columns", D, 5, models),
                                    ("brgemm+columns", torch.float32, 5, models),
                                    ("brgemm", torch.float32, 5, models), ("brgemm", torch.float32, 11, wide)):
    if routes.split_name(route)[0] not in compiled.candidate_routes(dtype):
        continue
    routes.forget()
    import os; os.environ["MOGLM_GEMM_ROUTE"] = route
    for name, make in makers.items():
        torch.manual_seed(0)
        model = make(dtype).train()
        x = torch.randn(6, batch, model.input_size, dtype=dtype)
        state = tuple(torch.randn(model.num_layers, batch, model.hidden_size, dtype=dtype) for _ in range(2))
        run(model, "compiled", torch.full_like(x, math.nan), state)  # the blocks it frees hold NaN
        hits = compiled.workspace_cache()["hits"]
        actual = run(model, "compiled", x, state) + [forward_only(model, "compiled", x, state)]
        expected = run(model.train(), "reference", x, state) + [forward_only(model, "reference", x, state)]
        model.train()
        out[f"{route} {name}"] = {
            "hits": compiled.workspace_cache()["hits"] - hits,
            # NaN counts as infinitely far (Python's max() would skip it)
            "max_difference": max(torch.nan_to_num((a - e).abs(), nan=math.inf).max().item()
                                  for a, e in zip(actual, expected, strict=True)),
            "dtype": str(dtype)}
compiled.empty_cache()
out["after_empty_cache"] = compiled.workspace_cache()
print(json.dumps(out))
"""


@pytest.mark.usefixtures("built")
def test_windows_on_reused_workspace_blocks_full_of_nan_still_match_reference_on_every_route():
    """Every buffer a window takes from the workspace cache (its smallest block set to 0 KiB here) holds NaN
    (``MOGLM_WORKSPACE_POISON``, and a window run on NaN input before): a window that read one before
    writing it would fail parity (outputs, final states, every gradient, and the forward-only window)
    against the reference loop, in float64 and on oneDNN's float32 route (its products over all rows and
    weight-gradient products too), split by rows and by columns (in a fresh process: the cache reads its
    settings at start)."""
    env = {**os.environ, "MOGLM_WORKSPACE_CACHE_MIN_KB": "0", "MOGLM_WORKSPACE_POISON": "1",
           "MOGLM_AUTO_BACKEND": "compiled"}
    done = subprocess.run([sys.executable, "-c", WORKSPACE_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    cleared = report.pop("after_empty_cache")
    assert cleared["cached_bytes"] == 0 and cleared["cached_blocks"] == 0, cleared
    assert len(report) >= 8, report  # both float64 routes at least, four models each
    for case, row in report.items():
        assert row["hits"] > 0, case  # the second window ran on the poisoned blocks
        assert row["max_difference"] < (1e-10 if row["dtype"] == "torch.float64" else 1e-4), (case, row)


@pytest.mark.usefixtures("built")
@pytest.mark.slow
def test_every_compiled_parity_test_passes_on_workspace_blocks_full_of_nan():
    """This file's parity tests (every model, option, route and split, the adaptation, double backward, edge
    cases) in a fresh process whose workspace cache hands out every block, of any size, full of NaN."""
    env = {**os.environ, "MOGLM_WORKSPACE_CACHE_MIN_KB": "0", "MOGLM_WORKSPACE_POISON": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__, "-k",
                           "match and not workspace"], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:]
    assert " passed" in done.stdout and " failed" not in done.stdout


@pytest.fixture
def workspace_cache_on(built):
    """Skip where the workspace cache is turned off (``MOGLM_WORKSPACE_CACHE_MB=0``); start and end it empty."""
    if compiled.workspace_cache()["limit_bytes"] == 0:
        pytest.skip("the workspace cache is turned off here (MOGLM_WORKSPACE_CACHE_MB=0)")
    compiled.empty_cache()
    yield
    compiled.empty_cache()


@pytest.mark.usefixtures("workspace_cache_on")
def test_the_workspace_cache_keeps_a_large_windows_buffers_for_the_next_and_empty_cache_frees_them():
    model = moglm.MogrifierLSTM(64, 256, rounds=5, rank=64)  # [T, B, 4H] float32 gates: 2 MiB
    model.backend = "compiled"
    x = torch.randn(16, 32, 64)
    model(x)[0].sum().backward()
    first = compiled.workspace_cache()
    assert first["cached_blocks"] > 0 and first["cached_bytes"] >= 2 << 20, first
    model(x)[0].sum().backward()
    second = compiled.workspace_cache()
    assert second["misses"] == first["misses"] and second["hits"] > first["hits"], (first, second)
    assert second["cached_bytes"] == first["cached_bytes"]
    compiled.empty_cache()
    assert compiled.workspace_cache()["cached_bytes"] == 0


@pytest.mark.usefixtures("workspace_cache_on")
def test_a_shorter_window_reuses_a_longer_ones_blocks_and_a_much_shorter_one_does_not():
    """Best fit: a block serves a request up to a quarter smaller (a last window cut short reuses the full
    windows' blocks), not a much smaller one (which would hold memory it does not use)."""
    model = moglm.LSTM(64, 256)  # [T, B, 4H] float32 gates: 1 MiB per 8 steps at B = 32
    model.backend = "compiled"

    def misses_and_hits(steps):
        before = compiled.workspace_cache()
        model(torch.randn(steps, 32, 64))[0].sum().backward()
        after = compiled.workspace_cache()
        return after["misses"] - before["misses"], after["hits"] - before["hits"]

    misses_and_hits(40)
    assert misses_and_hits(35) == (0, misses_and_hits(40)[1])  # 35/40 of each: every block is reused
    misses, _ = misses_and_hits(20)  # half of each: nothing fits
    assert misses > 0


def test_a_bad_workspace_cache_setting_is_one_line_naming_the_variable():
    env = {**os.environ, "MOGLM_WORKSPACE_CACHE_MB": "lots"}
    done = subprocess.run([sys.executable, "-m", "moglm", "info"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1
    assert done.stderr.strip() == "error: MOGLM_WORKSPACE_CACHE_MB must be a whole number from 0 to 2^40, got 'lots'"


def test_two_installs_get_two_build_folders_and_the_same_install_one(tmp_path, monkeypatch):
    """The build key covers the install (sources' folder, torch's, the interpreter's): a second checkout with the
    same sources builds its own library instead of relinking the first's at every switch."""
    import shutil

    key = build.build_key()
    assert build.build_key() == key
    copy = tmp_path / "csrc"
    shutil.copytree(build.source_dir(), copy)
    monkeypatch.setattr(build, "source_dir", lambda: copy)
    assert build.build_key() != key
    monkeypatch.setattr(build.sys, "prefix", "/another/venv")
    assert build.build_key() not in (key,)


def _subnormal_cell_state(module: torch.nn.Module, batch: int) -> torch.Tensor:
    """The final cell state of one step from a subnormal c0 (1e-39): zero weights, the forget and output gates
    open (sigmoid(20)), the candidate zero (tanh(0)), so that exactly, c1 = f * c0 is subnormal too."""
    hidden = module.hidden_size
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.zero_()
            if name.startswith("bias_ih"):
                p[hidden : 2 * hidden] = 20.0  # f
                p[3 * hidden :] = 20.0  # o
    xs = torch.zeros(1, batch, module.input_size)
    c0 = torch.full((1, batch, hidden), 1e-39)
    _, (_, c1) = module(xs, (torch.zeros(1, batch, hidden), c0))
    return c1


@pytest.mark.parametrize("batch", [1, 64])
def test_the_compiled_windows_flush_subnormals_to_zero_and_compute_them_when_switched_off(built, batch):
    """Subnormal floats cost a microcode assist per multiply-add on x86, and a trained model's steps make
    them, so the windows compute with them as zero (csrc/window.h, DenormalScope), on the calling thread and
    on every thread of a batch-parallel window; ``flush_denormals(False)`` restores IEEE arithmetic, which
    the reference loop (plain torch ops) keeps."""
    if not build.torch.ops.moglm.flush_denormals_supported():
        pytest.skip("flushing subnormals is x86-64 only")
    torch.manual_seed(0)
    reference = _subnormal_cell_state(moglm.LSTM(5, 7, backend="reference").eval(), batch)
    assert (reference > 0).all() and (reference < torch.finfo(torch.float32).tiny).all()  # subnormal, exactly
    with torch.no_grad():
        assert compiled.flushes_denormals()
        flushed = on_two_threads(_subnormal_cell_state)(moglm.LSTM(5, 7, backend="compiled").eval(), batch)
        with compiled.flush_denormals(False):
            assert not compiled.flushes_denormals()
            kept = on_two_threads(_subnormal_cell_state)(moglm.LSTM(5, 7, backend="compiled").eval(), batch)
        assert compiled.flushes_denormals()  # the switch is back as it was
    assert (flushed == 0).all()
    torch.testing.assert_close(kept, reference, rtol=1e-6, atol=0)
    assert compiled.info()["flush_denormals"]
    # nothing leaks out of the windows: torch's own ops, on this thread and its workers, keep subnormals
    assert on_two_threads(lambda: bool((torch.full((1 << 18,), 1e-30) * 1e-9 > 0).all()))()


@pytest.mark.usefixtures("built")
@pytest.mark.parametrize("rounds, rank, bias", [(1, 3, True), (2, 0, True), (5, 3, True), (5, 3, False), (4, 0, False)])
def test_the_ops_read_the_rounds_from_their_stacked_parameters_as_from_a_tensor_a_round(rounds, rank, bias):
    """The Python side passes each kind's stacked parameter (no view a round at every step); the op selects round
    i's row itself, and computes bit for bit what it computes from one tensor a round, forward and backward."""
    from moglm.recurrence.fused_lstm import layer_spec

    model = moglm.MogrifierLSTM(M, H, rounds=rounds, rank=rank, bias=bias, dtype=D)
    params = model.layer_parameters(0)
    spec = layer_spec(model.cells[0], params)
    stacked = functions._round_lists(spec, params)
    assert all(t.dim() == (2 if i == 2 else 3) for i, part in enumerate(stacked) for t in part)
    one_each = ([], [], [])
    for i in range(1, rounds + 1):
        kind, j = ("q", (i - 1) // 2) if i % 2 == 1 else ("r", i // 2 - 1)
        for part, name in zip(one_each, ("right" if rank else "weight", "left", "bias")):
            if f"mogrifier_{kind}_{name}" in params:
                part.append(params[f"mogrifier_{kind}_{name}"][j])
    gen = torch.Generator().manual_seed(0)
    xs, h0, c0 = (torch.randn(*shape, generator=gen, dtype=D) for shape in ((T, B, M), (B, H), (B, H)))
    route, b = compiled.gemm_route(D), params["bias_ih"] + params["bias_hh"] if bias else None

    def both(lists):
        out = torch.ops.moglm.mogrifier_lstm_forward(xs, h0, c0, None, params["weight_ih"], params["weight_hh"], b,
                                                     *lists, rounds, rank, True, False, True, route, 8)
        dys = torch.ones_like(out[0])
        grads = torch.ops.moglm.mogrifier_lstm_backward(
            xs, h0, c0, None, params["weight_ih"], params["weight_hh"], bias, *lists, rounds, rank, True, False,
            [out[0], *out[3:]], dys, None, None, True, True, route, 8)
        return [t for t in (*out, *grads) if t is not None and t.numel()]

    with torch.no_grad():  # the ops themselves, outside autograd (as the Function runs them)
        for a, c in zip(both(stacked), both(one_each), strict=True):
            assert torch.equal(a, c)
    if rounds > 1:
        wrong = ([stacked[0][0]], *stacked[1:])  # x's rounds only: h's are missing
        with pytest.raises(RuntimeError, match="stacked matrices"):
            torch.ops.moglm.mogrifier_lstm_forward(xs, h0, c0, None, params["weight_ih"], params["weight_hh"], b,
                                                   *wrong, rounds, rank, True, False, False, route, 8)
