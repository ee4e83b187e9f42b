"""``backend="auto"`` on CPU: the compiled or the fused window, as probed once per machine and shape class
(moglm.recurrence.auto), deterministic for a stored probe, without touching the user's RNG or gradients."""

from __future__ import annotations

import json

import pytest
import torch

import moglm
import moglm.recurrence as recurrence
from moglm.cells.lstm import LSTMCell
from moglm.recurrence import auto, compiled
from moglm.recurrence.compiled import routes


@pytest.fixture
def choice_dir(request):
    """A fresh, empty place for the stored choices (conftest's ``fresh_choice_store``), with the compiled window."""
    if not compiled.available():
        pytest.skip(f"compiled recurrence unavailable: {compiled.unavailable_reason()}")
    return request.getfixturevalue("fresh_choice_store")


@pytest.fixture
def spies(monkeypatch):
    """Counts of windows run by each path."""
    counts = {"compiled": 0, "fused": 0}
    real_compiled, real_fused = recurrence.run_compiled, recurrence.FUSED[LSTMCell]

    def compiled_spy(*args, **kwargs):
        counts["compiled"] += 1
        return real_compiled(*args, **kwargs)

    def fused_spy(*args, **kwargs):
        counts["fused"] += 1
        return real_fused(*args, **kwargs)

    monkeypatch.setattr(recurrence, "run_compiled", compiled_spy)
    monkeypatch.setitem(recurrence.FUSED, LSTMCell, fused_spy)
    return counts


def train_step(model, x):
    y, _ = model(x)
    y.sum().backward()


def the_class(model, x, training=True):
    return auto.shape_class(model.cells[0], x, training)


@pytest.mark.parametrize("stored_choice", ["compiled", "fused"])
def test_auto_runs_the_path_stored_for_the_layers_shape_class(choice_dir, spies, stored_choice):
    model, x = moglm.LSTM(6, 5), torch.randn(4, 3, 6)
    choice_dir.write_text(json.dumps({the_class(model, x): {"backend": stored_choice, "seconds": {}}}))
    train_step(model, x)
    assert spies[stored_choice] == 1 and sum(spies.values()) == 1


def test_the_probe_stores_its_choice_and_a_new_process_takes_the_same_path_without_probing(choice_dir, spies,
                                                                                          monkeypatch, capsys):
    model, x = moglm.LSTM(6, 5), torch.randn(4, 3, 6)
    train_step(model, x)
    said = capsys.readouterr().err  # the first-use probe says what it does and how long it took
    assert "timing the compiled and Python recurrences" in said and "chosen in" in said
    stored = json.loads(choice_dir.read_text())[the_class(model, x)]
    probed_routes = auto.probed_routes(stored["route_seconds"])  # from the stored file, whose keys are sorted
    assert stored["backend"] in ("compiled", "fused") and stored["route"] in probed_routes
    assert set(stored["seconds"]) == {"fused", *(f"compiled:{r}" for r in probed_routes)}
    assert auto.MIN_PAIRS <= stored["pairs"] <= auto.MAX_PAIRS
    assert spies["compiled"] > 1 and spies["fused"] > 1  # the probe ran both

    routes.forget()  # as a resumed run in a new process: reads the file, never probes again
    monkeypatch.setattr(auto, "probe", lambda *a, **k: pytest.fail("probed again although a choice is stored"))
    before = dict(spies)
    train_step(model, x)
    assert {k: spies[k] - before[k] for k in spies} == {k: int(k == stored["backend"]) for k in spies}
    assert "timing" not in capsys.readouterr().err  # no probe, no word


def test_training_and_evaluation_are_separate_classes(choice_dir):
    model, x = moglm.LSTM(6, 5), torch.randn(4, 3, 6)
    train_step(model, x)
    with torch.no_grad():
        model(x)
    assert set(json.loads(choice_dir.read_text())) == {the_class(model, x, True), the_class(model, x, False)}


def test_the_probe_leaves_the_global_rng_and_the_users_gradients_alone(choice_dir, monkeypatch):
    torch.manual_seed(0)
    model, x = moglm.LSTM(6, 5), torch.randn(4, 3, 6)
    rng = torch.get_rng_state()
    train_step(model, x)  # probes first
    assert torch.equal(torch.get_rng_state(), rng)
    probed = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    monkeypatch.setenv("MOGLM_AUTO_BACKEND", json.loads(choice_dir.read_text())[the_class(model, x)]["backend"])
    train_step(model, x)  # the same path, no probe
    for a, b in zip(probed, (p.grad for p in model.parameters()), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("forced", ["compiled", "fused"])
def test_moglm_auto_backend_forces_a_path_without_probing(choice_dir, spies, monkeypatch, forced):
    monkeypatch.setenv("MOGLM_AUTO_BACKEND", forced)
    train_step(moglm.LSTM(6, 5), torch.randn(4, 3, 6))
    assert spies[forced] == 1 and not choice_dir.exists()


@pytest.mark.parametrize("pin", ["compiled", "fused"])
def test_a_pinned_path_comes_before_the_variable_and_the_stored_choice_and_recording_sees_it(choice_dir, spies,
                                                                                           monkeypatch, pin):
    """What a compressed file's decoder relies on: every layer takes the pinned path, whatever this machine's
    variable or stored choice says, and nothing is probed or stored for it."""
    other = {"compiled": "fused", "fused": "compiled"}[pin]
    monkeypatch.setenv("MOGLM_AUTO_BACKEND", other)
    model, x = moglm.LSTM(6, 5, num_layers=2), torch.randn(4, 3, 6)
    with auto.pinned({"backend": pin, "route": None}), auto.recording() as seen:
        train_step(model, x)
    assert spies == {pin: 2, other: 0} and not choice_dir.exists()
    assert seen == [{"backend": pin, "route": None}] * 2
    with auto.recording() as seen:  # the pin ends with its block
        train_step(model, x)
    assert spies[other] == 2 and seen == [{"backend": other}] * 2


def test_pinning_nothing_leaves_auto_as_it_is_and_recording_ends_with_its_block():
    with auto.pinned(None), auto.recording() as seen:
        assert auto._PINNED.get() is None and auto._SEEN.get() is seen == []
    assert auto._SEEN.get() is None


def test_a_choice_within_noise_still_picks_the_faster_median_after_max_pairs(monkeypatch):
    # warm-ups, then pairs in alternating order: compiled 1.0 or 1.04, fused always 1.02: overlapping
    times = iter([1.0, 1.0] + [1.0, 1.02, 1.02, 1.04] * auto.MAX_PAIRS)
    monkeypatch.setattr(auto, "_time", lambda run: next(times))
    runners = {"compiled": None, "fused": None}
    result = auto.probe(moglm.LSTM(6, 5).cells[0], {}, torch.zeros(2, 3, 6), False, runners)
    assert result["pairs"] == auto.MAX_PAIRS and result["separated"] is False
    assert result["backend"] in runners


def test_a_clear_margin_stops_the_probe_early(monkeypatch):
    times = iter([1.0, 2.0] + [1.0, 2.0, 2.0, 1.0] * auto.MAX_PAIRS)  # compiled 1 s, fused 2 s (order alternates)
    monkeypatch.setattr(auto, "_time", lambda run: next(times))
    result = auto.probe(moglm.LSTM(6, 5).cells[0], {}, torch.zeros(2, 3, 6), False, {"compiled": None, "fused": None})
    assert result == {"backend": "compiled", "seconds": {"compiled": 1.0, "fused": 2.0}, "pairs": auto.MIN_PAIRS,
                      "separated": True}


def test_a_probe_that_fails_stores_the_compiled_window_so_every_process_agrees(choice_dir, spies, monkeypatch):
    def failing(*args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(auto, "probe", failing)
    model, x = moglm.LSTM(6, 5), torch.randn(4, 3, 6)
    with pytest.warns(UserWarning, match="could not time"):
        train_step(model, x)
    assert spies == {"compiled": 1, "fused": 0}
    stored = json.loads(choice_dir.read_text())[the_class(model, x)]
    assert stored["backend"] == "compiled" and "out of memory" in stored["failed"]


def test_where_nothing_can_be_stored_every_process_runs_the_compiled_window_without_probing(choice_dir, spies,
                                                                                            monkeypatch):
    monkeypatch.setattr(routes.os, "access", lambda path, mode: False)  # a read-only cache
    monkeypatch.setattr(auto, "probe", lambda *a, **k: pytest.fail("probed without a place to store the choice"))
    train_step(moglm.LSTM(6, 5), torch.randn(4, 3, 6))
    assert spies == {"compiled": 1, "fused": 0} and not choice_dir.exists()


def test_an_early_outlier_ages_out_of_the_probes_window(monkeypatch):
    # warm-ups, then pairs in alternating order; compiled 1.0 s but 3.0 s in the first pair; fused 2.0 s
    times = iter([1.0, 2.0, 3.0, 2.0] + [2.0, 1.0, 1.0, 2.0] * auto.MAX_PAIRS)
    monkeypatch.setattr(auto, "_time", lambda run: next(times))
    result = auto.probe(moglm.LSTM(6, 5).cells[0], {}, torch.zeros(2, 3, 6), False, {"compiled": None, "fused": None})
    assert result["separated"] and result["backend"] == "compiled" and result["pairs"] == auto.MIN_PAIRS + 1


def test_the_probe_times_the_compiled_window_on_the_classs_fastest_routes_and_runs_the_winner(choice_dir, spies,
                                                                                             monkeypatch):
    """The routes are timed on the layer's own per-step products; the compiled window runs on the two
    fastest in the probe; the winner is stored with the class, and every later compiled window of the class
    runs on it, backward included."""
    window_routes = []
    real = recurrence.run_compiled
    monkeypatch.setattr(recurrence, "run_compiled", lambda *a, **k: window_routes.append(k.get("route")) or real(*a, **k))
    model, x = moglm.MogrifierLSTM(6, 5, rounds=3, rank=2), torch.randn(4, 3, 6)
    monkeypatch.setattr(routes, "class_route", lambda *a: ("aten", {"aten": 1.0, "blas": 2.0, "panels": 3.0}))
    train_step(model, x)
    stored = json.loads(choice_dir.read_text())[the_class(model, x)]
    assert stored["route"] in ("aten", "blas") and stored["route_seconds"] == {"aten": 1.0, "blas": 2.0, "panels": 3.0}
    assert set(stored["seconds"]) == {"compiled:aten", "compiled:blas", "fused"}
    assert {compiled.ROUTES["aten"], compiled.ROUTES["blas"]} <= set(window_routes)  # the probe ran both
    assert compiled.ROUTES["panels"] not in window_routes
    if stored["backend"] == "compiled":
        assert window_routes[-1] == compiled.ROUTES[stored["route"]]  # the layer's own window, after the probe

    routes.forget()
    backward_routes = []
    real_backward = torch.ops.moglm.mogrifier_lstm_backward
    monkeypatch.setattr(torch.ops.moglm, "mogrifier_lstm_backward",
                        lambda *a: backward_routes.append(a[20]) or real_backward(*a))
    train_step(model, x)
    if stored["backend"] == "compiled":
        assert backward_routes == [compiled.ROUTES[stored["route"]]]  # the forward's route, kept for the backward


def test_each_compiled_window_lists_the_per_step_products_its_route_is_timed_on():
    from moglm.recurrence.compiled import CompiledLSTMFunction, CompiledMultiplicativeLSTMFunction
    from moglm.recurrence.fused_lstm import layer_spec

    def products(function, model, training):
        cell = model.cells[0]
        return function.step_products(layer_spec(cell, model.layer_parameters(0)), training)

    assert products(CompiledLSTMFunction, moglm.LSTM(6, 5), True) == [(5, 20, 1)]  # W_ih x before the loop
    assert products(CompiledLSTMFunction, moglm.LSTM(6, 5), False) == [(6, 20, 1), (5, 20, 1)]
    assert products(CompiledLSTMFunction, moglm.MogrifierLSTM(6, 5, rounds=2, rank=3), True) == [
        (6, 20, 1), (5, 20, 1), (5, 3, 1), (3, 6, 1), (6, 3, 1), (3, 5, 1)]  # x from h, then h from x
    assert products(CompiledLSTMFunction, moglm.MogrifierLSTM(6, 5, rounds=1, rank=0), True) == [
        (6, 20, 1), (5, 20, 1), (5, 6, 1)]
    assert products(CompiledMultiplicativeLSTMFunction, moglm.MultiplicativeLSTM(6, 5), True) == [(5, 5, 1), (5, 20, 1)]


@pytest.mark.usefixtures("choice_dir")
def test_the_class_route_is_one_this_machine_has_with_its_timings():
    """One timing per gate route (5 units: too narrow to split by columns), each named with the rounds' own
    fastest route where that differs."""
    model, x = moglm.MogrifierLSTM(6, 5, rounds=3, rank=2), torch.randn(4, 3, 6)
    route, seconds = recurrence._class_route(model.cells[0], model.layer_parameters(0), x, True)
    candidates = compiled.candidate_routes(torch.float32)
    assert sorted(routes.split_name(r)[0] for r in seconds) == sorted(candidates)
    names = [routes.split_name(r) for r in seconds]
    assert all(not columns and rounds in (None, *candidates) for _, columns, rounds in names)
    assert len({routes.split_name(r)[2] or routes.split_name(r)[0] for r in seconds}) == 1  # one rounds route
    assert route == min(seconds, key=seconds.get)


@pytest.mark.usefixtures("choice_dir")
@pytest.mark.parametrize("steps, window", [(1, 1), (3, 3), (70, 20)])
def test_the_class_route_times_the_products_in_windows_of_the_layers_own_steps(monkeypatch, steps, window):
    """A window packs its weights once, so one-token steps pay a packing route's packing at every step: the
    probe times its 20 products in windows of the layer's steps, at most 20."""
    seen, real = [], routes.time_route
    monkeypatch.setattr(routes, "time_route", lambda *a: seen.append(a[-1]) or real(*a))
    model, x = moglm.MogrifierLSTM(6, 5, rounds=3, rank=2), torch.randn(steps, 3, 6)
    route, seconds = recurrence._class_route(model.cells[0], model.layer_parameters(0), x, False)
    assert seen and set(seen) == {window}
    assert route == min(seconds, key=seconds.get) and all(0 < s < float("inf") for s in seconds.values())


def test_the_route_probe_packs_the_weights_once_per_window():
    """MKL's packed copy of the weights comes from the workspace cache: one request per thread and window, so
    windows of one product ask for it once per product, a single window once."""
    if not compiled.available() or not torch.ops.moglm.packed_gemm_available():
        pytest.skip("needs the compiled recurrence with MKL's packed GEMM")
    if torch.ops.moglm.workspace_cache_stats()[4] == 0:
        pytest.skip("the workspace cache is off (MOGLM_WORKSPACE_CACHE_MB=0)")
    code, reps = compiled.route_code("mkl_packed"), 4

    def requests(steps: int) -> int:  # [K=512, N=1024]: a 2 MiB packed copy, which the cache keeps
        before = torch.ops.moglm.workspace_cache_stats()
        torch.ops.moglm.time_gemm_route(code, 128, 512, 1024, reps, False, -1, steps)
        after = torch.ops.moglm.workspace_cache_stats()
        return (after[2] + after[3]) - (before[2] + before[3])

    once = requests(0)
    assert once > 0
    assert requests(reps) == once
    assert requests(1) == reps * once


@pytest.mark.usefixtures("choice_dir")
@pytest.mark.parametrize("make, splits", [
    (lambda: moglm.LSTM(19, 37), True),
    (lambda: moglm.MogrifierLSTM(19, 37, rounds=3, rank=4), True),
    (lambda: moglm.MultiplicativeLSTM(19, 37), True),
    (lambda: moglm.LSTM(19, 31), False),  # 31 units: fewer than 16 a thread
], ids=["lstm", "mogrifier", "multiplicative_lstm", "lstm_too_narrow"])
def test_on_two_threads_each_route_is_also_timed_split_by_columns_where_the_window_can(make, splits):
    model, x = make(), torch.randn(4, 6, 19)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        route, seconds = recurrence._class_route(model.cells[0], model.layer_parameters(0), x, True)
    finally:
        torch.set_num_threads(threads)
    candidates = compiled.candidate_routes(torch.float32)
    split = {routes.split_name(r)[0] for r in seconds if routes.split_name(r)[1]}
    assert split == (set(candidates) if splits else set())
    assert route == min(seconds, key=seconds.get)


def test_the_probe_times_the_two_fastest_routes_by_rows_and_the_two_fastest_by_columns(choice_dir, monkeypatch):
    timings = {"aten": 1.0, "blas": 2.0, "panels": 3.0, "aten+columns": 2.5, "blas+columns:aten": 1.5,
               "panels+columns": 2.7}
    monkeypatch.setattr(routes, "class_route", lambda *a: ("aten", timings))
    probed = {}
    monkeypatch.setattr(auto, "probe", lambda cell, p, xs, training, runners: probed.update(runners) or {
        "backend": "compiled:blas+columns:aten", "seconds": {k: 1.0 for k in runners}, "pairs": 5, "separated": True})
    model, x = moglm.MogrifierLSTM(6, 5, rounds=3, rank=2), torch.randn(4, 3, 6)
    train_step(model, x)
    assert set(probed) == {"compiled:aten", "compiled:blas", "compiled:blas+columns:aten", "compiled:aten+columns",
                           "fused"}
    stored = json.loads(choice_dir.read_text())[the_class(model, x)]
    assert stored["backend"] == "compiled" and stored["route"] == "blas+columns:aten"


def test_the_probe_separates_the_fastest_of_several_paths_as_soon_as_its_margin_exceeds_the_noise(monkeypatch):
    monkeypatch.setattr(auto, "_time", lambda run: run())  # each runner returns its own timing
    runners = {"compiled:aten": lambda *a: 1.5, "compiled:blas": lambda *a: 1.0, "fused": lambda *a: 2.0}
    result = auto.probe(moglm.LSTM(6, 5).cells[0], {}, torch.zeros(2, 3, 6), False, runners)
    assert result == {"backend": "compiled:blas", "seconds": {"compiled:aten": 1.5, "compiled:blas": 1.0, "fused": 2.0},
                      "pairs": auto.MIN_PAIRS, "separated": True}


def test_a_forced_gemm_route_is_the_classs_route_too(choice_dir, monkeypatch):
    monkeypatch.setenv("MOGLM_GEMM_ROUTE", "aten")
    model, x = moglm.LSTM(6, 5), torch.randn(4, 3, 6)
    assert recurrence._class_route(model.cells[0], model.layer_parameters(0), x, True) == ("aten", {})
    train_step(model, x)
    stored = json.loads(choice_dir.read_text())[the_class(model, x)]
    assert stored["route"] == "aten" and set(stored["seconds"]) == {"compiled:aten", "fused"}


def test_probed_routes_break_ties_by_name_so_a_stored_probe_names_the_same_routes():
    seconds = {"aten": 2.0, "panels": 1.0, "brgemm": 1.0, "blas+columns": 3.0, "aten+columns": 3.0,
               "panels+columns": 0.5}
    assert auto.probed_routes(seconds) == ["brgemm", "panels", "panels+columns", "aten+columns"]
    stored = json.loads(json.dumps(seconds, sort_keys=True))  # as the choice file stores them
    assert auto.probed_routes(stored) == auto.probed_routes(seconds)


def test_a_shape_class_is_named_once_per_shape_and_follows_the_threads_and_the_cell(monkeypatch):
    """shape_class keeps the names it built (a one-token step asks at every layer and step): each is the name
    built afresh, a change of threads, steps, rows, dtype, rounds or training gives another, and the kept names
    stay bounded."""
    monkeypatch.setattr(auto, "_CLASS_NAMES", {})
    monkeypatch.setattr(auto, "_CLASS_NAMES_MAX", 6)
    cells = [moglm.MogrifierLSTM(8, 8, rounds=r).cells[0] for r in (4, 5)] + [LSTMCell(8, 8)]
    threads = torch.get_num_threads()
    names = set()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            for cell in cells:
                for steps, rows, dtype, training in ((1, 1, torch.float32, False), (70, 64, torch.float32, True),
                                                     (1, 1, torch.float64, False)):
                    xs = torch.zeros(steps, rows, 8, dtype=dtype)
                    name = auto.shape_class(cell, xs, training)
                    fresh = auto._class_name(cell, xs, training, count)
                    assert name == auto.shape_class(cell, xs, training) == fresh
                    names.add(name)
    finally:
        torch.set_num_threads(threads)
    assert len(names) == 2 * 3 * 3 and len(auto._CLASS_NAMES) == 6
