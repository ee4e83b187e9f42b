"""Throughput of the recurrent layers against torch.nn.LSTM, in one run.

For each hidden size H (input size = H, one layer, float32, batch B, window T) it measures tokens/s of
forward+backward (training mode, input requiring grad) and of forward only (eval mode, no_grad) for:
torch.nn.LSTM; moglm's LSTM, LSTM with state dropout, Mogrifier (r=5, k=64) and multiplicative LSTM on
the default backend (the compiled recurrence where it is built: the report's ``recurrence`` entry says
what ran); the same three on the Python fused path (what ran before the compiled recurrence); and the
Mogrifier on the reference loop. Measurements are interleaved (every repeat times every model once, in
turn) and the median is kept, because the machine is shared.

Each result is reported as a ratio to nn.LSTM and as a fraction of the machine's measured fp32 GEMM peak
(best of a few large matrix products, through torch.mm and through oneDNN). FLOPs count only the matrix
products: per token ``2 (m+n) 4n`` for an LSTM, plus ``r * 2 k (m+n)`` for low-rank mogrifier rounds,
plus ``2 (m+n) n`` for the multiplicative LSTM's ``W_mx x`` and ``W_mh h``; forward+backward is 3x that.
Two bounds go with each ratio: the ``ceiling`` (the model's products at the GEMM peak, nothing else taking time)
and, where moglm's LSTM ran too, the ratio ``at the LSTM's rate`` (the model's products at the FLOP rate the LSTM
reached in the same run). Beside the ratio of the medians, ``vs_nn_lstm_runs`` keeps every repeat's paired ratio,
whose range says how steady the ordering is on a noisy machine; their median comes with a distribution-free 95%
confidence interval (``paired_median_vs_nn_lstm``, ``paired_ci95_vs_nn_lstm``: order statistics, no assumption
on the noise's shape), and ``best_vs_nn_lstm`` is the ratio of the fastest timings (``timeit``'s estimator: the
time least disturbed by other work), with ``best_fraction_of_gemm_peak`` the fastest timing's rate. Each repeat
starts one model later in the list than the one before, so no model is always timed first or right after the
same one.

Memory of a T=500 window, two numbers:
* ``saved_mb``: bytes of the distinct tensors autograd keeps for backward after the forward
  (``torch.autograd.graph.saved_tensors_hooks``; parameters and the input excluded). This is the
  activation memory, exactly, but not the transient buffers of the backward.
* ``peak_mb``: on CUDA ``torch.cuda.max_memory_allocated`` over one forward+backward minus the memory
  before it; on CPU the peak growth of the resident set size over one forward+backward, sampled every
  millisecond in a fresh subprocess per model (includes the transient buffers of the backward, and
  whatever the allocator keeps).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from . import command_line, write_report

MODELS = (
    "torch.nn.LSTM",
    "moglm LSTM",
    "moglm LSTM + state dropout",
    "moglm Mogrifier r=5 k=64",
    "moglm multiplicative LSTM",
    "LSTM, Python fused",
    "Mogrifier, Python fused",
    "multiplicative LSTM, Python fused",
    "Mogrifier, reference loop",
)

#: the same windows replayed as CUDA graphs (moglm.recurrence.cuda_graphs); CUDA only
GRAPHED = ("LSTM, CUDA graphs", "Mogrifier, CUDA graphs", "multiplicative LSTM, CUDA graphs",
           "Mogrifier, CUDA graphs, step kernels")

#: what ``--device cuda`` compares by default (the GPU path's issue: cuDNN against moglm's windows)
CUDA_MODELS = ("torch.nn.LSTM", "moglm LSTM", "moglm Mogrifier r=5 k=64", "moglm multiplicative LSTM", *GRAPHED)


#: ``--precision``: how the float32 models run their products (see :func:`precision`)
PRECISIONS = ("fp32", "tf32", "bf16")


@contextlib.contextmanager
def precision(name: str, device: str = "cpu"):
    """Every model's products in ``name`` inside the block: ``fp32``, exact float32 products (cuBLAS and cuDNN
    kept off TF32, which cuDNN allows by default); ``tf32``, CUDA only, float32 products on the tensor cores
    in TF32 (cuBLAS and cuDNN); ``bf16``, ``torch.autocast`` to bfloat16 (moglm's windows keep float32
    states and cell arithmetic, as cuDNN's LSTM does)."""
    if name not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {name!r}")
    kind = torch.device(device).type
    if name == "tf32" and kind != "cuda":
        raise ValueError("tf32 is a CUDA precision (use fp32 or bf16 on CPU)")
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = name == "tf32"
    try:
        with torch.autocast(kind, dtype=torch.bfloat16, enabled=name == "bf16"):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


class Graphed(torch.nn.Module):
    """A layer whose fused windows run as CUDA graphs while it runs (captured once per shape). ``rounds``:
    the Mogrifier rounds' path, as ``MOGLM_TRITON_ROUNDS`` names it, while a window is captured (a graph
    keeps the kernels it captured, its backward included). A window that would run ungraphed (a failed
    capture) is an error, which the bench records, rather than a plain window timed under a graphed name."""

    def __init__(self, inner: torch.nn.Module, rounds: str | None = None) -> None:
        super().__init__()
        self.inner, self.rounds = inner, rounds

    def forward(self, *args, **kwargs):
        from ..recurrence import cuda_graphs

        with _environment("MOGLM_TRITON_ROUNDS", self.rounds), cuda_graphs.graphs(strict=True):
            return self.inner(*args, **kwargs)


@contextlib.contextmanager
def _environment(name: str, value: str | None):
    """``os.environ[name] = value`` inside the block (``None``: unchanged)."""
    before = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if value is not None:
            if before is None:
                del os.environ[name]
            else:
                os.environ[name] = before


def build(name: str, hidden: int, device: str = "cpu") -> torch.nn.Module:
    import moglm

    makers: dict[str, Callable[[], torch.nn.Module]] = {
        "torch.nn.LSTM": lambda: torch.nn.LSTM(hidden, hidden),
        "moglm LSTM": lambda: moglm.LSTM(hidden, hidden),
        "moglm LSTM + state dropout": lambda: moglm.LSTM(hidden, hidden, state_dropout=0.3),
        "moglm Mogrifier r=5 k=64": lambda: moglm.MogrifierLSTM(hidden, hidden, rounds=5, rank=64),
        "moglm multiplicative LSTM": lambda: moglm.MultiplicativeLSTM(hidden, hidden),
        "LSTM, Python fused": lambda: moglm.LSTM(hidden, hidden, backend="fused"),
        "Mogrifier, Python fused": lambda: moglm.MogrifierLSTM(hidden, hidden, rounds=5, rank=64, backend="fused"),
        "multiplicative LSTM, Python fused": lambda: moglm.MultiplicativeLSTM(hidden, hidden, backend="fused"),
        "Mogrifier, reference loop": lambda: moglm.MogrifierLSTM(hidden, hidden, rounds=5, rank=64, backend="reference"),
        "LSTM, CUDA graphs": lambda: Graphed(moglm.LSTM(hidden, hidden)),
        "Mogrifier, CUDA graphs": lambda: Graphed(moglm.MogrifierLSTM(hidden, hidden, rounds=5, rank=64)),
        "multiplicative LSTM, CUDA graphs": lambda: Graphed(moglm.MultiplicativeLSTM(hidden, hidden)),
        "Mogrifier, CUDA graphs, step kernels": lambda: Graphed(
            moglm.MogrifierLSTM(hidden, hidden, rounds=5, rank=64), rounds="step"),
    }
    if name in GRAPHED and not str(device).startswith("cuda"):
        raise ValueError(f"{name!r} runs on CUDA only")
    return makers[name]().to(device)


def flops_per_token(name: str, hidden: int) -> float:
    """Forward FLOPs per token of the matrix products (input size = hidden)."""
    m = n = hidden
    lstm = 2 * (m + n) * 4 * n
    if "Mogrifier" in name:
        return lstm + 5 * 2 * 64 * (m + n)
    if "multiplicative" in name:
        return lstm + 2 * (m + n) * n
    return lstm


def ceiling(nn_lstm_seconds: float, flops: float, peak_gflops: float) -> float:
    """The multiple of ``nn.LSTM`` a model would reach if its matrix products (``flops`` a window) ran at the
    GEMM peak and nothing else took time, against ``nn.LSTM``'s measured time: a target above it needs
    products faster than the peak measured in the same run (the recurrence's multiply-adds alone forbid it)."""
    return nn_lstm_seconds * peak_gflops * 1e9 / flops


def at_lstm_rate(lstm_vs_nn_lstm: float, name: str, hidden: int) -> float:
    """The multiple of ``nn.LSTM`` a model would reach if its matrix products ran at the rate moglm's LSTM ran
    its own in the same run (``lstm_vs_nn_lstm``: the LSTM's measured multiple): the LSTM's multiple scaled by
    the two models' FLOPs a token. A target above it asks the model's extra products (the Mogrifier's narrow
    rounds, the multiplicative LSTM's second product a step) to run faster than the LSTM's wide gate products."""
    return lstm_vs_nn_lstm * flops_per_token("moglm LSTM", hidden) / flops_per_token(name, hidden)


def paired_ratios(base: list[float], seconds: list[float]) -> list[float]:
    """nn.LSTM's time over the model's, repeat by repeat (each repeat times every model once, in turn, so a
    ratio compares two timings taken moments apart: the machine's spells longer than a repeat cancel out of it,
    and the range of these ratios shows what shorter ones do)."""
    return [b / s for b, s in zip(base, seconds)]


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free confidence interval for the median of the population ``values`` were drawn from:
    the order statistics ``(x_(j), x_(n+1-j))`` with ``j`` the largest for which ``P(Bin(n, 1/2) < j)`` is at
    most ``(1 - level) / 2``. It assumes only that the values are independent draws; ``None`` where there are
    too few of them for any interval at this level (fewer than 6 at 95%)."""
    n, tail, j, below = len(values), (1 - level) / 2, 0, 0.0
    while True:  # below = P(Bin(n, 1/2) <= j), the chance that j + 1 or fewer values fall under the median
        below += math.comb(n, j) / 2 ** n
        if below > tail or j + 1 > n // 2:
            break
        j += 1
    if j == 0:
        return None
    ordered = sorted(values)
    return ordered[j - 1], ordered[n - j]


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def gemm_peak(device: str = "cpu", sizes=(2048, 4096), repeats: int = 3) -> dict[str, float]:
    """Best GFLOP/s of large square float32 products in the precision in force (:func:`precision`), through
    torch.mm and (CPU) oneDNN."""
    from ..recurrence.gemm import Linear

    out: dict[str, float] = {}
    for size in sizes:
        a = torch.randn(size, size, device=device)
        b = torch.randn(size, size, device=device)
        routes = {"torch.mm": lambda: torch.mm(a, b)}
        lin = Linear(b, None, rows=size)
        if lin.onednn:
            routes["oneDNN"] = lambda: lin(a)
        for route, f in routes.items():
            f()
            _sync(device)
            best = float("inf")
            for _ in range(repeats):
                start = time.perf_counter()
                f()
                _sync(device)
                best = min(best, time.perf_counter() - start)
            out[route] = max(out.get(route, 0.0), 2 * size**3 / best / 1e9)
    out["peak"] = max(out.values())
    return out


def _time_once(model: torch.nn.Module, x: torch.Tensor, train: bool, device: str) -> float:
    if train:
        model.train()
        model.zero_grad(set_to_none=True)
        x.grad = None
        _sync(device)
        start = time.perf_counter()
        y, _ = model(x)
        y.sum().backward()
    else:
        model.eval()
        _sync(device)
        start = time.perf_counter()
        with torch.no_grad():
            model(x)
    _sync(device)
    return time.perf_counter() - start


GENERATION_BACKENDS = ("compiled", "fused", "reference")
#: the baselines of the one-token steps: torch.nn.LSTM of the same width as a user gets it, and on CPU with oneDNN
#: (mkldnn) off, whose RNN primitive torch takes for an LSTM's forward there
GENERATION_BASELINES = ("torch.nn.LSTM", "torch.nn.LSTM, oneDNN off")


def _one_token_ms(model: torch.nn.Module, x: torch.Tensor, tokens: int, device: str) -> float:
    """Milliseconds a one-token step of ``model`` on ``x`` ``[1, 1, H]``, its state carried (eval, no grad)."""
    with torch.no_grad():
        state = None
        for _ in range(5):
            _, state = model(x, state)
        _sync(device)
        start = time.perf_counter()
        for _ in range(tokens):
            _, state = model(x, state)
        _sync(device)
    return (time.perf_counter() - start) / tokens * 1e3


def generation_ms(hidden: int, tokens: int = 200, device: str = "cpu") -> dict[str, float]:
    """Milliseconds per token of one-token steps (B=1, T=1, eval, state carried), as sampling and
    batch-1 dynamic evaluation run them, for the Mogrifier (r=5, k=64) on each backend that can run here, and for
    ``torch.nn.LSTM`` of the same width (:data:`GENERATION_BASELINES`; one layer each)."""
    import moglm

    out: dict[str, float] = {}
    model = moglm.MogrifierLSTM(hidden, hidden, rounds=5, rank=min(64, hidden)).to(device).eval()
    x = torch.randn(1, 1, hidden, device=device)
    for backend in GENERATION_BACKENDS:
        model.backend = backend
        try:
            out[backend] = _one_token_ms(model, x, tokens, device)
        except ValueError:  # a backend that cannot run here (compiled off CPU or unbuilt)
            continue
    lstm = torch.nn.LSTM(hidden, hidden).to(device).eval()
    out[GENERATION_BASELINES[0]] = _one_token_ms(lstm, x, tokens, device)
    if device == "cpu":
        enabled = torch.backends.mkldnn.enabled
        torch.backends.mkldnn.enabled = False  # (its flags() context would also reset its TF32 setting, and warn)
        try:
            out[GENERATION_BASELINES[1]] = _one_token_ms(lstm, x, tokens, device)
        finally:
            torch.backends.mkldnn.enabled = enabled
    return out


def saved_tensor_mb(model: torch.nn.Module, x: torch.Tensor) -> float:
    """MB of the distinct storages autograd saves for backward in one training forward (parameters and
    the input itself excluded)."""
    exclude = {p.untyped_storage().data_ptr() for p in model.parameters()} | {x.untyped_storage().data_ptr()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in exclude:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y, _ = model(x)
    del y
    return sum(seen.values()) / 2**20


def _peak_growth_mb(name: str, hidden: int, batch: int, bptt: int, device: str) -> float:
    """Peak memory growth over one forward+backward (see the module docstring)."""
    torch.manual_seed(0)
    model = build(name, hidden, device).train()
    x = torch.randn(bptt, batch, hidden, device=device, requires_grad=True)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        y, _ = model(x)
        y.sum().backward()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    import threading

    page = os.sysconf("SC_PAGE_SIZE")

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * page

    before, peak, done = rss(), [0], threading.Event()

    def sample() -> None:  # the resident set size, every millisecond, while the step runs
        while not done.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.001)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    y, _ = model(x)
    y.sum().backward()
    done.set()
    sampler.join()
    return (max(peak[0], rss()) - before) / 2**20


def _window_memory(name: str, hidden: int, batch: int, bptt: int, device: str,
                   precision_name: str = "fp32") -> dict[str, float | None]:
    """Both memory numbers of one model in ``precision_name``, measured where this runs (a fresh process on
    CPU). The peak comes first: memory the allocator kept from an earlier pass would hide part of the growth."""
    with precision(precision_name, device):
        return _window_memory_now(name, hidden, batch, bptt, device)


def _window_memory_now(name: str, hidden: int, batch: int, bptt: int, device: str) -> dict[str, float | None]:
    peak = _peak_growth_mb(name, hidden, batch, bptt, device) if (
        device.startswith("cuda") or Path("/proc/self/statm").exists()) else None
    x = torch.randn(bptt, batch, hidden, device=device, requires_grad=True)
    return {"saved_mb": saved_tensor_mb(build(name, hidden, device), x), "peak_mb": peak}


def window_memory(name: str, hidden: int, batch: int, bptt: int, device: str,
                  precision_name: str = "fp32") -> dict[str, Any]:
    """``{"bptt", "saved_mb", "peak_mb"}`` of one model over a ``bptt`` window. On CPU in a fresh
    subprocess, so that neither the allocator's leftovers of earlier measurements nor this process's
    other tensors count (and a window too big for the machine fails alone: its numbers are ``None``)."""
    if device.startswith("cuda"):  # in this process; a failure is recorded, as a failed subprocess is on CPU
        try:
            return {"bptt": bptt, **_window_memory(name, hidden, batch, bptt, device, precision_name)}
        except RuntimeError as error:
            return {"bptt": bptt, "saved_mb": None, "peak_mb": None, "error": str(error)[:300]}
    code = (
        "import json, torch; from moglm.bench.throughput import _window_memory; "
        f"print(json.dumps(_window_memory({name!r}, {hidden}, {batch}, {bptt}, 'cpu', {precision_name!r})))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    try:
        return {"bptt": bptt, **json.loads(done.stdout.strip().splitlines()[-1])}
    except (ValueError, IndexError):
        return {"bptt": bptt, "saved_mb": None, "peak_mb": None, "error": done.stderr.strip()[-300:]}


def run_throughput(
    hidden_sizes=(256, 650, 1024),
    batch: int = 64,
    bptt: int = 70,
    repeats: int = 5,
    memory_bptt: int = 500,
    models=MODELS,
    device: str = "cpu",
    out_path: str | Path | None = "benchmarks/results/throughput.json",
    log: Callable[[str], None] = print,
    precision_name: str = "fp32",
    verbose: bool = False,
) -> dict[str, Any]:
    """Measure everything with products in ``precision_name`` (:func:`precision`); write JSON to ``out_path``
    (if given) and return the report. ``verbose``: log the recurrence's details, not just their summary."""
    with precision(precision_name, device):
        return _run_throughput(hidden_sizes, batch, bptt, repeats, memory_bptt, models, device, out_path, log,
                               precision_name, verbose)


def _run_throughput(hidden_sizes, batch, bptt, repeats, memory_bptt, models, device, out_path, log,
                    precision_name, verbose=False) -> dict[str, Any]:
    torch.manual_seed(0)
    report: dict[str, Any] = {
        "command": command_line(),
        "config": dict(batch=batch, bptt=bptt, repeats=repeats, memory_bptt=memory_bptt, device=device,
                       dtype="float32", layers=1, input_size="= hidden"),
        "machine": dict(platform=platform.platform(), processor=platform.processor(), torch=torch.__version__,
                        threads=torch.get_num_threads(), cpus=os.cpu_count(),
                        loadavg_start=os.getloadavg() if hasattr(os, "getloadavg") else None),
    }
    from ..recurrence import compiled

    from ..recurrence.triton_pointwise import pointwise_for

    report["recurrence"] = compiled.info(paths=False) if device == "cpu" else {
        "compiled": False, "reason": f"device {device}",
        "pointwise": pointwise_for(torch.empty(0, device=device)).name}  # the fused window's kernels: triton or torch
    rec = report["recurrence"]
    summary = (f"compiled, GEMM route {rec.get('gemm_route')}" if rec.get("compiled")
               else f"not compiled ({rec.get('reason')})")
    log(f"recurrence: {summary}" + (f"\n{json.dumps(rec, indent=1, default=str)}" if verbose else
                                    " (--verbose prints its details)"))
    log("measuring the GEMM peak ...")
    report["gemm_gflops"] = peak = gemm_peak(device)
    log(f"  {peak}")
    results = []
    for hidden in hidden_sizes:
        built = {name: build(name, hidden, device) for name in models}
        x = torch.randn(bptt, batch, hidden, device=device, requires_grad=True)
        times: dict[tuple[str, bool], list[float]] = {(name, train): [] for name in models for train in (True, False)}
        for name, model in built.items():  # warm-up
            for train in (True, False):
                _time_once(model, x, train, device)
        names = list(built)
        for rep in range(repeats):
            shift = rep % len(names)  # each repeat starts one model later: no model always first or after another
            for name in names[shift:] + names[:shift]:
                model = built[name]
                for train in (True, False):
                    times[name, train].append(_time_once(model, x, train, device))
            log(f"H={hidden} repeat {rep + 1}/{repeats} done")
        base = {train: statistics.median(times["torch.nn.LSTM", train]) for train in (True, False)} if (
            "torch.nn.LSTM" in models
        ) else None
        lstm = {train: base[train] / statistics.median(times["moglm LSTM", train]) for train in (True, False)} if (
            base and "moglm LSTM" in models) else None
        for name in models:
            row: dict[str, Any] = {"hidden": hidden, "model": name}
            for train, key in ((True, "train"), (False, "forward")):
                seconds, fastest = statistics.median(times[name, train]), min(times[name, train])
                pairs = paired_ratios(times["torch.nn.LSTM", train], times[name, train]) if base else None
                flops = flops_per_token(name, hidden) * bptt * batch * (3 if train else 1)
                row[key] = {
                    "ms": seconds * 1e3,
                    "ms_all": [t * 1e3 for t in times[name, train]],
                    "tokens_per_s": bptt * batch / seconds,
                    "vs_nn_lstm": base[train] / seconds if base else None,
                    "vs_nn_lstm_runs": pairs,
                    "paired_median_vs_nn_lstm": statistics.median(pairs) if pairs else None,
                    "paired_ci95_vs_nn_lstm": median_interval(pairs) if pairs else None,
                    "best_vs_nn_lstm": min(times["torch.nn.LSTM", train]) / fastest if base else None,
                    "gflops": flops / seconds / 1e9,
                    "fraction_of_gemm_peak": flops / seconds / 1e9 / peak["peak"],
                    "best_fraction_of_gemm_peak": flops / fastest / 1e9 / peak["peak"],
                    "ceiling_vs_nn_lstm": ceiling(base[train], flops, peak["peak"]) if base else None,
                    "at_lstm_rate_vs_nn_lstm": at_lstm_rate(lstm[train], name, hidden)
                    if lstm and name != "torch.nn.LSTM" else None,
                }
            results.append(row)
        del built, x
        report.setdefault("generation_ms_per_token", {})[str(hidden)] = generation_ms(hidden, device=device)
        log(f"H={hidden} one-token generation ms: {report['generation_ms_per_token'][str(hidden)]}")
        if memory_bptt:
            for name in models:
                row = next(r for r in results if r["hidden"] == hidden and r["model"] == name)
                row["memory"] = window_memory(name, hidden, batch, memory_bptt, device, precision_name)
            log(f"H={hidden} memory done")
        report["results"] = results
        if device == "cpu":  # what backend="auto" chose for the classes this run met (probed in it, or stored)
            from ..recurrence.compiled import routes

            report["auto_backend_choices"] = routes.backends_used()
        write_report(report, out_path)  # after every hidden size: an interrupted run keeps what it measured
    report["machine"]["loadavg_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    write_report(report, out_path)
    return report



def markdown_table(report: dict[str, Any]) -> str:
    """The report as a markdown table (one row per hidden size and model)."""
    peak = report["gemm_gflops"]
    where = report["machine"].get("gpu") or f"{report['machine']['threads']} threads"
    lines = [
        f"B={report['config']['batch']}, T={report['config']['bptt']}, 1 layer, input = hidden, float32 with "
        f"{report['config'].get('precision', 'fp32')} products, {where}; GEMM peak {peak['peak']:.0f} GFLOP/s "
        f"({', '.join(f'{k} {v:.0f}' for k, v in peak.items() if k != 'peak')}). Ceiling: the multiple of "
        "nn.LSTM a model would reach with its products at that peak and nothing else taking time. ×nn.LSTM: the "
        "ratio of the medians, and in brackets the range of the repeats' paired ratios. At LSTM rate: the multiple "
        "of nn.LSTM a model would reach with its products at the rate moglm LSTM ran its own. Paired: the median "
        "of the repeats' paired ratios, and in brackets its 95% confidence interval (given from 6 repeats on).",
        "",
        "| H | model | train tok/s | train ×nn.LSTM | train paired | train % peak | train ceiling | train at LSTM rate "
        "| fwd tok/s | fwd ×nn.LSTM | fwd paired | fwd % peak | fwd ceiling | fwd at LSTM rate | T=500 saved MB "
        "| T=500 peak MB |",
        "| ---: | --- |" + " ---: |" * 14,
    ]
    for r in report["results"]:
        mem = r.get("memory", {})
        cells = [str(r["hidden"]), r["model"]]
        for key in ("train", "forward"):
            m = r[key]
            ratio = f"{m['vs_nn_lstm']:.2f}" if m["vs_nn_lstm"] is not None else "-"
            runs = m.get("vs_nn_lstm_runs")  # absent from reports written before it was measured
            if runs and len(runs) > 1 and r["model"] != "torch.nn.LSTM":
                ratio += f" ({min(runs):.2f}-{max(runs):.2f})"
            top, rate = m.get("ceiling_vs_nn_lstm"), m.get("at_lstm_rate_vs_nn_lstm")
            paired, interval = m.get("paired_median_vs_nn_lstm"), m.get("paired_ci95_vs_nn_lstm")
            if paired is None or r["model"] == "torch.nn.LSTM":
                paired_cell = "-"
            else:
                paired_cell = f"{paired:.2f}" + (f" [{interval[0]:.2f}-{interval[1]:.2f}]" if interval else "")
            cells += [f"{m['tokens_per_s']:,.0f}", ratio, paired_cell, f"{100 * m['fraction_of_gemm_peak']:.0f}%",
                      "-" if top is None else f"{top:.2f}", "-" if rate is None else f"{rate:.2f}"]
        for key in ("saved_mb", "peak_mb"):
            value = mem.get(key)
            cells.append("-" if value is None else f"{value:,.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    generation = report.get("generation_ms_per_token")
    if generation:
        columns = GENERATION_BACKENDS + GENERATION_BASELINES
        lines += ["", "One-token generation (B=1, T=1, eval), Mogrifier r=5 k=64 on each backend and torch.nn.LSTM, "
                  "ms per token:", "", "| H | " + " | ".join(columns) + " |", "| ---: |" + " ---: |" * len(columns)]
        for hidden, row in generation.items():
            lines.append(f"| {hidden} | " + " | ".join(f"{row[b]:.2f}" if b in row else "-" for b in columns) + " |")
    return "\n".join(lines)


def main(argv=None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description="Tokens/s of moglm's recurrent layers against torch.nn.LSTM.")
    parser.add_argument("--hidden-size", "--hidden", dest="hidden", type=int, nargs="+", default=[256, 650, 1024])
    parser.add_argument("--batch-size", "--batch", dest="batch", type=int, default=64)
    parser.add_argument("--bptt", type=int, default=70)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--memory-bptt", type=int, default=500, help="window of the memory measurement (0: skip)")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32", choices=list(PRECISIONS))
    parser.add_argument("--out", default="benchmarks/results/throughput.json")
    args = parser.parse_args(argv)
    report = run_throughput(args.hidden, args.batch, args.bptt, args.repeats, args.memory_bptt, tuple(args.models),
                            args.device, args.out, precision_name=args.precision)
    print(markdown_table(report))
    return report


if __name__ == "__main__":
    main()
