"""``moglm bench``: the throughput benchmark runs from the command line at tiny sizes and writes its JSON."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from conftest import tiny_config, tiny_format_run
from moglm.cli import main

ROOT = Path(__file__).resolve().parents[2]


def benchmark(name: str):
    """The script ``benchmarks/<name>.py``, loaded as a module (the benchmarks are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_bench_throughput_writes_ratios_to_nn_lstm_for_every_model(tmp_path, capsys):
    out = tmp_path / "throughput.json"
    code = main(["bench", "throughput", "--hidden-size", "65", "--batch-size", "3", "--bptt", "5", "--repeats", "1",
                 "--memory-bptt", "0", "--model", "torch.nn.LSTM", "--model", "moglm Mogrifier r=5 k=64",
                 "--out", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    rows = {r["model"]: r for r in report["results"]}
    assert set(rows) == {"torch.nn.LSTM", "moglm Mogrifier r=5 k=64"}
    assert rows["torch.nn.LSTM"]["train"]["vs_nn_lstm"] == 1.0
    assert rows["moglm Mogrifier r=5 k=64"]["train"]["tokens_per_s"] > 0
    assert report["gemm_gflops"]["peak"] > 0
    assert set(report["generation_ms_per_token"]["65"]) >= {"fused", "reference", "torch.nn.LSTM",
                                                            "torch.nn.LSTM, oneDNN off"}
    assert min(report["generation_ms_per_token"]["65"].values()) > 0
    for row in rows.values():  # the ceiling is the ratio the model would have at the GEMM peak
        for m in (row["train"], row["forward"]):
            assert m["ceiling_vs_nn_lstm"] == pytest.approx(m["vs_nn_lstm"] / m["fraction_of_gemm_peak"])
            assert len(m["vs_nn_lstm_runs"]) == 1 and m["vs_nn_lstm_runs"][0] == pytest.approx(m["vs_nn_lstm"])
            assert m["at_lstm_rate_vs_nn_lstm"] is None  # moglm LSTM did not run
            assert m["paired_median_vs_nn_lstm"] == pytest.approx(m["vs_nn_lstm"])
            assert m["paired_ci95_vs_nn_lstm"] is None  # one repeat: no interval
    assert "| 65 | moglm Mogrifier r=5 k=64 |" in capsys.readouterr().out


def test_the_ceiling_is_nn_lstms_time_over_the_models_products_at_the_gemm_peak_and_old_reports_show_a_dash():
    """A model doing 1.25x nn.LSTM's multiply-adds, against an nn.LSTM at 80% of the peak, can reach at most
    1 / (0.8 * 1.25) = 1.0x it; the table shows the ceiling beside the ratio, and '-' in a report without one."""
    from moglm.bench.throughput import ceiling, markdown_table

    nn_flops = 8e9
    nn_seconds = nn_flops / (0.8 * 100e9)  # nn.LSTM at 80% of a 100 GFLOP/s peak
    assert ceiling(nn_seconds, 1.25 * nn_flops, 100.0) == pytest.approx(1.0)
    assert ceiling(nn_seconds, nn_flops, 100.0) == pytest.approx(1.25)

    def measured(ratio, fraction, top=None):
        m = {"tokens_per_s": 1000.0, "vs_nn_lstm": ratio, "fraction_of_gemm_peak": fraction}
        return m if top is None else {**m, "ceiling_vs_nn_lstm": top}

    report = {"gemm_gflops": {"peak": 100.0, "torch.mm": 100.0}, "machine": {"threads": 2},
              "config": {"batch": 64, "bptt": 70},
              "results": [{"hidden": 650, "model": "moglm multiplicative LSTM", "train": measured(0.85, 0.88, 0.97),
                           "forward": measured(0.80, 0.91, 0.88)},
                          {"hidden": 650, "model": "older report", "train": measured(0.9, 0.9),
                           "forward": measured(0.9, 0.9)}]}
    table = markdown_table(report)
    row = "| 650 | moglm multiplicative LSTM | 1,000 | 0.85 | - | 88% | 0.97 | - | 1,000 | 0.80 | - | 91% | 0.88 | - | - | - |"
    assert row in table
    assert "| 650 | older report | 1,000 | 0.90 | - | 90% | - | - | 1,000 | 0.90 | - | 90% | - | - | - | - |" in table
    assert "fwd ceiling" in table and "nothing else taking time" in table


def test_the_paired_ratios_compare_each_repeat_and_the_lstm_rate_bound_scales_the_lstms_ratio_by_the_flops():
    """A repeat's ratio is nn.LSTM's time over the model's in that repeat; a model with 1.25x the LSTM's
    multiply-adds, its products at the LSTM's rate, reaches the LSTM's multiple over 1.25; the table shows the
    repeats' range beside the ratio and the bound in its own column."""
    from moglm.bench.throughput import at_lstm_rate, flops_per_token, markdown_table, paired_ratios

    assert paired_ratios([1.0, 2.0, 3.0], [2.0, 2.0, 1.5]) == [0.5, 1.0, 2.0]
    hidden = 650
    extra = flops_per_token("moglm multiplicative LSTM", hidden) / flops_per_token("moglm LSTM", hidden)
    assert extra == pytest.approx(1.25)  # its second product a step: (m + n) n more multiply-adds on (m + n) 4n
    assert at_lstm_rate(1.1, "moglm multiplicative LSTM", hidden) == pytest.approx(1.1 / 1.25)
    assert at_lstm_rate(1.1, "moglm LSTM", hidden) == pytest.approx(1.1)
    assert at_lstm_rate(1.0, "moglm Mogrifier r=5 k=64", 256) < at_lstm_rate(1.0, "moglm Mogrifier r=5 k=64", 1024) < 1

    def measured(ratio, runs, rate):
        return {"tokens_per_s": 1000.0, "vs_nn_lstm": ratio, "vs_nn_lstm_runs": runs, "fraction_of_gemm_peak": 0.5,
                "ceiling_vs_nn_lstm": 2.0, "at_lstm_rate_vs_nn_lstm": rate}

    report = {"gemm_gflops": {"peak": 100.0}, "machine": {"threads": 2}, "config": {"batch": 64, "bptt": 70},
              "results": [{"hidden": 650, "model": "torch.nn.LSTM", "train": measured(1.0, [1.0, 1.0], None),
                           "forward": measured(1.0, [1.0, 1.0], None)},
                          {"hidden": 650, "model": "moglm multiplicative LSTM",
                           "train": measured(0.9, [0.84, 0.9, 0.97], 0.88), "forward": measured(0.8, [0.8], 0.85)}]}
    table = markdown_table(report)
    assert "| 650 | moglm multiplicative LSTM | 1,000 | 0.90 (0.84-0.97) | - | 50% | 2.00 | 0.88 | 1,000 | 0.80 | - | 50% " in table
    assert "| 650 | torch.nn.LSTM | 1,000 | 1.00 | - | 50% | 2.00 | - | 1,000 | 1.00 | - |" in table


def test_the_paired_median_comes_with_an_order_statistic_interval_that_covers_it_at_95_percent():
    """The interval is the pair of order statistics whose binomial tails are each at most 2.5%: the extremes
    for 6-8 repeats, the second from each end from 9, none below 6; a simulated median is covered about 95%
    of the time or more, and the table shows the paired median with its interval."""
    import random

    from moglm.bench.throughput import markdown_table, median_interval

    assert median_interval([0.9, 0.8, 1.0, 0.7, 1.1]) is None  # 5 values: even the extremes cover only 93.75%
    assert median_interval([0.9, 0.8, 1.0, 0.7, 1.1, 0.95]) == (0.7, 1.1)
    assert median_interval([float(v) for v in range(9)]) == (1.0, 7.0)  # P(Bin(9, 1/2) <= 1) = 10/512 < 2.5%
    assert median_interval([float(v) for v in range(41)]) == (13.0, 27.0)  # P(Bin(41, 1/2) <= 13) < 2.5% < <= 14
    rng = random.Random(0)
    covered = 0
    for _ in range(2000):  # samples from a skewed distribution whose median is 1 (lognormal, mu = 0)
        low, high = median_interval([rng.lognormvariate(0.0, 0.5) for _ in range(15)])
        covered += low <= 1.0 <= high
    assert 0.94 <= covered / 2000 <= 0.995

    def measured(ratio, paired, interval):
        return {"tokens_per_s": 1000.0, "vs_nn_lstm": ratio, "vs_nn_lstm_runs": [ratio] * 9,
                "paired_median_vs_nn_lstm": paired, "paired_ci95_vs_nn_lstm": interval, "fraction_of_gemm_peak": 0.5}

    report = {"gemm_gflops": {"peak": 100.0}, "machine": {"threads": 2}, "config": {"batch": 64, "bptt": 70},
              "results": [{"hidden": 256, "model": "moglm Mogrifier r=5 k=64",
                           "train": measured(0.84, 0.86, [0.83, 0.89]), "forward": measured(0.7, 0.72, None)}]}
    table = markdown_table(report)
    assert "| 0.84 (0.84-0.84) | 0.86 [0.83-0.89] | 50% |" in table and "| 0.70 (0.70-0.70) | 0.72 | 50% |" in table


def test_bench_throughput_rejects_an_unknown_model_in_one_line(tmp_path, capsys):
    code = main(["bench", "throughput", "--model", "GRU", "--out", str(tmp_path / "t.json")])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: Invalid value for '--model': 'GRU' is not one of 'torch.nn.LSTM'") and "\n" not in err
    assert not (tmp_path / "t.json").exists()


BUDGET = """
[data]
format = "word"
[model]
architecture = "{arch}"
num_params = 6000
{cell}
[train]
batch_size = 4
bptt = 8
max_steps = 6
eval_every = 3
eval_batch_size = 2
device = "cpu"
[evaluation]
temperature_tokens = 100
"""


@pytest.mark.slow
def test_bench_budget_is_the_budget_experiment_with_its_report(tmp_path, capsys):
    text = tmp_path / "tiny.txt"
    text.write_text("\n".join(f"the cat {i % 7} sat on the mat {i % 5} ." for i in range(500)) + "\n")
    code = main(["bench", "budget", "--scale", "smoke", "--data", str(text), "--data-format", "char", "--workers", "1",
                 "--root", str(tmp_path / "experiments")])
    assert code == 0
    out = capsys.readouterr().out
    assert "| LSTM | [" in out and "| Mogrifier | [" in out
    assert (tmp_path / "experiments" / "smoke-tiny" / "budget" / "report.md").is_file()


def test_bench_gemm_routes_writes_under_the_bench_directory_never_the_working_tree(tmp_path, capsys, monkeypatch):
    from moglm.recurrence import compiled

    if not compiled.available():
        pytest.skip(f"compiled recurrence unavailable: {compiled.unavailable_reason()}")
    monkeypatch.setenv("MOGLM_BENCH_DIR", str(tmp_path / "bench"))
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "gemm-routes", "--hidden-size", "8", "--batch-size", "4"]) == 0
    report = json.loads((tmp_path / "bench" / "gemm_routes.json").read_text())
    assert not (tmp_path / "benchmarks").exists()
    routes = compiled.candidate_routes(torch.float32)
    assert {r["product"] for r in report["results"]} == {"gate forward", "gate backward", "round x -> low",
                                                         "round low -> out", "weight gradient"}
    assert all(set(r["gflops"]) == set(routes) and min(r["gflops"].values()) > 0 for r in report["results"])
    out = capsys.readouterr().out
    assert "| 8 | gate forward (16 -> 32) |" in out and "| 8 | weight gradient (280 rows -> [32, 16]) |" in out


def test_bench_gemm_routes_times_the_gate_products_split_by_columns_on_two_threads(tmp_path):
    from moglm.bench.gemm_routes import markdown_table, run_gemm_routes
    from moglm.recurrence import compiled

    if not compiled.available():
        pytest.skip(f"compiled recurrence unavailable: {compiled.unavailable_reason()}")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        report = run_gemm_routes((37,), batch=4, steps=3, repeats=1, out_path=tmp_path / "r.json", log=lambda _: None)
    finally:
        torch.set_num_threads(threads)
    routes = compiled.candidate_routes(torch.float32)
    split = {r + compiled.COLUMNS_SUFFIX for r in routes}
    for row in report["results"]:
        expected = set(routes) | (split if row["product"].startswith("gate") else set())
        assert set(row["gflops"]) == expected and min(row["gflops"].values()) > 0, row["product"]
    table = markdown_table(report)
    assert "aten+columns" in table.splitlines()[0]
    assert table.splitlines()[-2].count("| -") == len(routes)  # a round's row: no split timings


@pytest.mark.slow
def test_bench_end_to_end_times_a_config_on_both_paths(tiny_corpus, tmp_path, capsys):
    path = tmp_path / "tiny.toml"
    path.write_text(BUDGET.format(arch="mogrifier", cell="cell = { rounds = 2, rank = 2 }").replace(
        "[data]\n", f'[data]\npath = "{tiny_corpus}"\n'))
    out = tmp_path / "e2e.json"
    assert main(["bench", "end-to-end", str(path), "--steps", "21", "--no-default-command", "--out", str(out)]) == 0
    row = json.loads(out.read_text())["configs"][str(path)]
    assert row["fused"]["tokens_per_s"] > 0 and row["auto"]["tokens_per_s"] > 0
    assert row["speedup"] == row["auto"]["tokens_per_s"] / row["fused"]["tokens_per_s"]
    assert "tokens/s (21 steps)" in capsys.readouterr().out


def test_bench_epoch_times_a_config_and_works_out_its_epoch(tiny_corpus, tmp_path, capsys):
    path = tmp_path / "tiny.toml"
    path.write_text(BUDGET.format(arch="lstm", cell="").replace("[data]\n", f'[data]\npath = "{tiny_corpus}"\n'))
    out = tmp_path / "epoch.json"
    assert main(["bench", "epoch", str(path), "--steps", "21", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["tokens_per_s"] > 0
    assert report["epoch_seconds"] == pytest.approx(report["train_tokens"] / report["tokens_per_s"])
    assert "tokens/s: an epoch of" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusals of a machine without CUDA")
@pytest.mark.parametrize("args, message", [
    (["throughput", "--device", "cuda"], "device 'cuda' was asked for but CUDA is not available"),
    (["throughput", "--model", "Mogrifier, CUDA graphs"], "'Mogrifier, CUDA graphs' runs on CUDA only"),
    (["epoch", "--device", "cuda"], "device 'cuda' was asked for but CUDA is not available"),
    (["epoch", "--steps", "5"], "--steps must be at least 20"),
])
def test_the_gpu_benchmark_without_a_gpu_is_one_line_before_any_work(args, message, tmp_path, capsys):
    out = tmp_path / "t.json"
    assert main(["bench", *args, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not out.exists()


def test_the_gpu_benchmark_defaults_to_the_issues_grid_on_cuda(monkeypatch, tmp_path, capsys):
    """On CUDA: H = 650 and 1500, B = 64 and 128, in fp32, TF32 and bf16 autocast, cuDNN against moglm's windows
    with and without graphs, one report per precision and batch size, then the paper config's epoch
    (measured here with the work itself stubbed)."""
    from moglm import device as device_module
    from moglm.bench import end_to_end, throughput

    calls = []
    monkeypatch.setattr(device_module, "resolve_device", lambda name: torch.device("cuda"))
    monkeypatch.setattr(throughput, "run_throughput",
                        lambda *a, **k: calls.append((*a, k["precision_name"])) or {"results": []})
    monkeypatch.setattr(throughput, "markdown_table", lambda report: "")
    monkeypatch.setattr(end_to_end, "epoch_seconds", lambda *a, **k: calls.append(a) or {"epoch_seconds": 1.0})
    assert main(["bench", "throughput", "--device", "cuda", "--out", str(tmp_path / "t.json")]) == 0
    grid, epoch = calls[:6], calls[6]
    assert [(a[0], a[1], a[2], a[4], a[-1]) for a in grid] == [
        ((650, 1500), b, 70, 70, p) for p in ("fp32", "tf32", "bf16") for b in (64, 128)]
    assert [a[7].name for a in grid[:2]] == ["t-fp32-b64.json", "t-fp32-b128.json"]
    assert grid[0][5] == throughput.CUDA_MODELS and set(throughput.GRAPHED) < set(grid[0][5])
    assert epoch == ("ptb-word-mogrifier-paper", "cuda", 30, tmp_path / "t-epoch.json")  # its JSON beside the grid's


def test_bench_hf_dyneval_times_dynamic_against_static_at_each_context(tmp_path, capsys):
    pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")
    out = tmp_path / "hf.json"
    assert main(["bench", "hf-dyneval", "--layers", "1", "--width", "16", "--heads", "2", "--context", "8",
                 "--context", "24", "-n", "8", "--tokens", "40", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [r["context"] for r in report["rows"]] == [8, 24]
    for row in report["rows"]:
        assert row["window"] == row["context"] + 8 and row["static_cpu_seconds"] > 0
        assert row["cost"] == pytest.approx(row["dynamic_cpu_seconds"] / row["static_cpu_seconds"])
        assert row["adapted_parameters"] < report["model"]["parameters"]  # the embeddings stay fixed
    assert "| 24 + 8 | 40 |" in capsys.readouterr().out


def test_tf32_is_a_cuda_precision_refused_on_cpu_in_one_line(capsys):
    assert main(["bench", "throughput", "--precision", "tf32", "--hidden-size", "8"]) == 1
    err = capsys.readouterr().err
    assert "tf32 is a CUDA precision" in err and err.count("\n") == 1


def test_the_precision_context_sets_tf32_and_autocast_and_restores_them():
    from moglm.bench.throughput import precision

    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    with precision("bf16", "cpu"):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        assert not torch.backends.cudnn.allow_tf32  # fp32 and bf16 keep cuDNN off TF32
    assert not torch.is_autocast_enabled("cpu")
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before
    with pytest.raises(ValueError, match="CUDA precision"):
        with precision("tf32", "cpu"):
            pass


def test_the_dynamic_evaluation_cost_benchmark_times_and_profiles_both_passes(tiny_corpus, tmp_path):
    bench = benchmark("dyneval_cost")
    config = tmp_path / "tiny.toml"
    config.write_text(tiny_config(tiny_corpus).to_toml())
    report = bench.measure(str(config), "cpu", tokens=60, segment_length=5, profiled=20)
    assert report["tokens"] == 60 and report["static_seconds"] > 0 and report["dynamic_seconds"] > 0
    assert report["cost"] == pytest.approx(report["dynamic_seconds"] / report["static_seconds"])
    assert "graphs" not in report  # CUDA only
    for way in ("static", "dynamic"):  # both passes profiled over 20 tokens: host ops, no kernels on CPU
        row = report["profile"][way]
        assert row["tokens"] == 20 and row["wall_per_token_ms"] == pytest.approx(row["wall_ms"] / 20)
        assert row["top_host_ops"] and row["gpu_busy_ms"] == 0 and not row["top_kernels"]
    backward = {way: any("backward" in op.lower() for op in report["profile"][way]["top_host_ops"])
                for way in ("static", "dynamic")}
    assert backward == {"static": False, "dynamic": True}  # only dynamic evaluation takes gradients


@pytest.mark.slow
def test_the_compiled_phases_benchmark_times_every_phase_and_counts_its_products(tmp_path):
    """Small sizes (the Mogrifier's rank 64 needs 64 units): every model's phases are timed, the weight-gradient shapes are the models' own weights,
    and the FLOPs of the phases add up to the training step's count in the throughput bench."""
    from moglm.bench.throughput import flops_per_token

    bench = benchmark("compiled_phases")
    for name in bench.MODELS[1:]:
        weights = sum(p.numel() for n, p in bench.build(name, 64).named_parameters() if "bias" not in n)
        assert sum(a * b for a, b in bench.weight_gradient_shapes(name, 64)) == weights, name
        flops = bench.phase_flops(name, rows=10, n=64)
        assert sum(flops.values()) == pytest.approx(3 * flops_per_token(name, 64) * 10), name
    if not compiled_available():
        pytest.skip("the weight-gradient timing needs the compiled recurrence")
    report = bench.main(["--hidden-size", "64", "--batch-size", "4", "--bptt", "3", "--repeats", "1",
                         "--out", str(tmp_path / "phases.json")])
    assert {r["model"] for r in report["results"]} == set(bench.MODELS)
    for r in report["results"]:
        expected = {"forward", "backward"} | (set() if r["model"] == "torch.nn.LSTM" else
                                              {"backward, data", "weight gradients"})
        assert set(r["phases"]) == expected, r["model"]
        # measured directly: the forward and the whole step (forward + backward); the backward is their difference,
        # which at these toy sizes (a few microseconds) can come out at or below zero in a noisy single timing
        phases = r["phases"]
        assert phases["forward"]["ms"] > 0 and phases["forward"]["ms"] + phases["backward"]["ms"] > 0, r["model"]
        assert all(math.isfinite(v["ms"]) for v in phases.values()), r["model"]
    assert (tmp_path / "phases.json").is_file()


def compiled_available() -> bool:
    from moglm.recurrence import compiled

    return compiled.available()


@pytest.mark.slow
def test_the_workspace_cache_benchmark_times_steps_with_the_cache_on_and_off_in_fresh_processes(tmp_path,
                                                                                                monkeypatch):
    """Tiny sizes (the cache keeps blocks of any size here): each setting runs in its own process (the cache
    reads its settings at start), and the process with the cache off reports a cache that kept nothing while
    the one with it on kept blocks."""
    if not compiled_available():
        pytest.skip("the workspace cache belongs to the compiled recurrence")
    monkeypatch.setenv("MOGLM_WORKSPACE_CACHE_MIN_KB", "0")  # for the bench's processes, not this one (loaded)
    bench = benchmark("workspace_cache")
    report = bench.main(["--hidden-size", "64", "--batch-size", "64", "--bptt", "8", "--steps", "2", "--rounds", "1",
                         "--models", "moglm Mogrifier r=5 k=64", "--out", str(tmp_path / "workspace.json")])
    (row,) = report["results"]
    assert row["on"]["ms"] > 0 and row["off"]["ms"] > 0 and row["off_over_on"] > 0
    assert row["off"]["workspace_cache"]["limit_bytes"] == 0 and row["off"]["workspace_cache"]["hits"] == 0
    assert row["on"]["workspace_cache"]["limit_bytes"] > 0 and row["on"]["workspace_cache"]["cached_blocks"] > 0
    assert (tmp_path / "workspace.json").is_file()


def test_the_subnormal_bench_times_a_runs_passes_flushed_and_kept_with_the_same_predictions(tmp_path):
    """benchmarks/subnormals.py: per batch, the window pass and the one-step pass of a trained run, with the
    compiled windows flushing subnormals and keeping them: both timed, their ratio, and predictions that agree
    (a tiny run's steps make no subnormal that changes a log probability)."""
    run = tiny_format_run(tmp_path / "run", "char")
    text = tmp_path / "text.txt"
    text.write_text("the cat sees the dog .\nthe owl hears the cow .\n" * 4)
    bench = benchmark("subnormals")
    out = tmp_path / "subnormals.json"
    report = bench.main([str(run), str(text), "--batch", "3", "--bptt", "5", "--steps", "3", "--repeats", "2",
                         "--threads", "1", "--out", str(out)])
    assert [(r["pass"], r["batch"], r["steps"]) for r in report["results"]] == [("window", 3, 5), ("step", 3, 3)]
    for row in report["results"]:
        assert row["ms_per_step_flushed"] > 0 and row["ms_per_step_kept"] > 0
        assert row["kept_over_flushed"] == pytest.approx(row["ms_per_step_kept"] / row["ms_per_step_flushed"])
        assert row["max_abs_log_prob_difference"] < 1e-5
    assert 0 <= report["embedding_subnormal_entries"] <= report["embedding_entries"]
    assert json.loads(out.read_text())["results"] == report["results"]


def test_the_window_routes_bench_times_every_route_the_probe_ranks_at_each_window_length(tmp_path):
    """benchmarks/window_routes.py: for each window length, every route of the class probe's ranking with its
    product timing, the one route it chose, and the window's own time per step on that route."""
    from moglm.recurrence import compiled

    if not compiled.available():
        pytest.skip(f"compiled recurrence unavailable: {compiled.unavailable_reason()}")
    bench = benchmark("window_routes")
    out = tmp_path / "routes.json"
    report = bench.main(["--hidden-size", "8", "--rank", "2", "--batch", "4", "--steps", "1", "--steps", "3",
                         "--repeats", "1", "--windows", "2", "--threads", "1", "--out", str(out)])
    for steps in (1, 3):
        rows = [r for r in report["results"] if r["steps"] == steps]
        gates = {compiled.routes.split_name(r["route"])[0] for r in rows}
        assert gates == set(compiled.candidate_routes(torch.float32))
        assert sum(r["probe_choice"] for r in rows) == 1
        chosen = next(r for r in rows if r["probe_choice"])
        assert chosen["probe_seconds"] == min(r["probe_seconds"] for r in rows)
        assert all(r["ms_per_step"] > 0 for r in rows)
    assert json.loads(out.read_text())["results"] == report["results"]


def test_the_weight_gradient_classes_bench_times_both_routes_pinned_in_turns_and_names_the_machines_choice(
        tmp_path, monkeypatch):
    """benchmarks/weight_gradient_classes.py: per H and model, training steps with the weight gradients pinned to
    at::mm and to the ukernel in turns (which goes first alternating), their paired ratio, and this machine's
    one route with its probe's timings."""
    from moglm.recurrence import compiled
    from moglm.recurrence.compiled import routes

    if not compiled.available() or "brgemm" not in compiled.candidate_routes(torch.float32):
        pytest.skip("needs the compiled recurrence and oneDNN's float32 ukernel")
    monkeypatch.delenv("MOGLM_GEMM_ROUTE", raising=False)
    monkeypatch.setattr(routes, "route_file", lambda dtype, kind="gemm_route": tmp_path / f"{kind}.json")
    monkeypatch.setattr(routes, "_probe_weight_gradients", lambda dtype, candidates: {"aten": 1.0, "brgemm": 0.5})
    routes.forget()
    pinned = []
    real = routes.weight_gradient_route

    def spy(dtype):
        pinned.append(routes._weight_gradient_pin.get())
        return real(dtype)

    monkeypatch.setattr(routes, "weight_gradient_route", spy)
    bench = benchmark("weight_gradient_classes")
    out = tmp_path / "classes.json"
    report = bench.main(["--hidden-size", "9", "--batch-size", "3", "--bptt", "4", "--repeats", "2",
                         "--model", "moglm LSTM", "--out", str(out)])
    (row,) = report["rows"]
    assert row["hidden"] == 9 and row["machine_route"] == "brgemm"
    assert row["probe_seconds"] == {"aten": 1.0, "brgemm": 0.5}
    assert len(row["seconds"]["aten"]) == len(row["seconds"]["brgemm"]) == 2
    assert row["aten_over_brgemm"] > 0 and row["faster_here"] in ("aten", "brgemm")
    aten, brgemm = routes.ROUTES["aten"], routes.ROUTES["brgemm"]
    steps = [code for code in pinned if code is not None]  # one backward a step: two warm-ups and two repeats
    assert steps == [aten, brgemm, brgemm, aten, aten, brgemm, brgemm, aten]  # in turns, neither always first
    assert json.loads(out.read_text())["rows"] == report["rows"]
    routes.forget()


def test_the_one_token_step_bench_times_the_step_the_stack_and_the_ops_alone(tmp_path):
    """benchmarks/one_token_step.py: per size and batch, a one-token step of the shipped byte model's
    architecture, its stack alone and its two compiled ops alone; the ops are a part of the stack, the stack of
    the step, and the overhead is what the step costs beyond the ops."""
    from moglm.recurrence import compiled

    if not compiled.available():
        pytest.skip(f"compiled recurrence unavailable: {compiled.unavailable_reason()}")
    bench = benchmark("one_token_step")
    out = tmp_path / "step.json"
    report = bench.main(["--hidden-size", "8", "--batch", "1", "--batch", "3", "--steps", "20", "--repeats", "2",
                         "--out", str(out)])
    assert [(r["hidden"], r["batch"]) for r in report["results"]] == [(8, 1), (8, 3)]
    for r in report["results"]:
        assert 0 < r["ops_us"] < r["layers_us"] < r["step_us"]
        assert r["overhead"] == pytest.approx(1 - r["ops_us"] / r["step_us"])
    assert json.loads(out.read_text())["results"] == report["results"]
    with pytest.raises(SystemExit, match="at least 1"):
        bench.main(["--batch", "0"])
