"""Wall-clock cost of dynamic evaluation against static evaluation of a config's model on a device.

    python benchmarks/dyneval_cost.py --device cuda                     # the paper's 24M PTB Mogrifier
    python benchmarks/dyneval_cost.py --config ptb-word-mogrifier-cpu --tokens 2000

The model is the config's, as initialised (the cost of a pass does not depend on the weights' values), in
evaluation mode. It reads the first ``--tokens`` tokens of the config's test split as one stream: a static
pass (windows of 70), then dynamic evaluation (thesis 4.2: score a segment, take one gradient step on it,
go on; the default rule rms-rmsdecay, eq. 4.5-4.7, with segments of 20), each timed once after a warm-up of both on
every window length they meet. RMS statistics are ones (the cost of the update does not depend on their values). The
ratio of the two wall-clock times is what the GPU path's target (at most 3x static) is about. On CUDA it
measures both again with every fused window replayed as a CUDA graph (``moglm.recurrence.cuda_graphs``).
Writes JSON (default ``benchmarks/results/dyneval_cost_<device>.json``) and prints a line per way.

With ``--profile N`` it also profiles both passes over the first N tokens (torch.profiler, after the timed
passes; on CUDA as CUDA graphs): per token, the wall time, the GPU's busy time and kernel launches, the host
ops with the most self time, and the kernels with the most GPU time. Where dynamic evaluation's cost goes
beyond its GPU time, the host (launches, synchronisations) is what it waits on.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from moglm.bench.profiling import split_events
from moglm.dynamic_evaluation import Hyperparameters
from moglm.dynamic_evaluation.evaluate import dynamic_evaluate, static_pass
from moglm.recurrence import cuda_graphs
from moglm.runs.build import build_model, load_data
from moglm.runs.config import load_config

HERE = Path(__file__).resolve().parent
#: the static pass's windows (static_pass's default)
STATIC_WINDOW = 70


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(config: str, device: str, tokens: int, segment_length: int = 20, profiled: int = 0) -> dict:
    """Static and dynamic passes timed; on CUDA also with CUDA graphs (``"graphs"``), on the same model and
    tokens; with ``profiled`` tokens, both passes over them profiled (``"profile"``)."""
    cfg = load_config(config, [])
    corpus = load_data(cfg.data)
    where = torch.device(device)
    model = build_model(cfg.model, len(corpus.vocab)).to(where).eval()
    ids = corpus["test"][: tokens + 1]
    hp = Hyperparameters(segment_length=segment_length)
    rms = {name: torch.ones_like(p) for name, p in model.named_parameters()}
    machine = dict(platform=platform.platform(), processor=platform.processor(), torch=torch.__version__,
                   threads=torch.get_num_threads())
    if where.type == "cuda":
        machine["gpu"] = torch.cuda.get_device_name(where)
    report = {"config": config, "device": device, "tokens": int(len(ids) - 1), "machine": machine,
              "hyperparameters": hp.as_dict(), "parameters": sum(p.numel() for p in model.parameters()),
              **_timed(model, ids, hp, rms, where, graphs=False)}
    if where.type == "cuda":
        with cuda_graphs.graphs(strict=True):  # a failed capture is an error here, not plain windows timed
            report["graphs"] = _timed(model, ids, hp, rms, where, graphs=True)
    if profiled:
        with cuda_graphs.graphs(where.type == "cuda", strict=True):
            head = ids[: profiled + 1]
            static = static_pass(model, head, bptt=STATIC_WINDOW)  # given to the dynamic pass, as when timed
            report["profile"] = {way: _profiled(run, where) for way, run in (
                ("static", lambda: static_pass(model, head, bptt=STATIC_WINDOW)),
                ("dynamic", lambda: dynamic_evaluate(model, head, hp, rms, static=static)))}
            n = len(head) - 1  # fewer than asked for where the stream is shorter
            for row in report["profile"].values():
                row.update(tokens=n, wall_per_token_ms=row["wall_ms"] / n,
                           gpu_busy_per_token_ms=row["gpu_busy_ms"] / n,
                           kernel_launches_per_token=row["kernel_launches"] / n)
    return report


def _profiled(run, where: torch.device, top: int = 12) -> dict:
    """``run()`` once under torch.profiler (after a warm-up run): wall and GPU busy milliseconds, kernel
    launches, and the host ops (self time) and kernels (GPU time) that take the most. A dynamic pass adapts a
    copy of the model of its own, so on CUDA its profile includes capturing that copy's windows (three warm-up
    runs and a capture per layer and window shape), as every ``dynamic_evaluate`` call does."""
    run()
    _sync(where)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if where.type == "cuda" else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        run()
        _sync(where)
        wall = time.perf_counter() - start
    host, kernels = split_events(prof)
    return {"wall_ms": 1e3 * wall, "gpu_busy_ms": sum(ms for ms, _ in kernels.values()),
            "kernel_launches": sum(n for _, n in kernels.values()),
            "top_host_ops": {k: {"self_ms": ms, "calls": n}
                             for k, (ms, n) in sorted(host.items(), key=lambda kv: -kv[1][0])[:top]},
            "top_kernels": {k: {"ms": ms, "launches": n}
                            for k, (ms, n) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]}}


def _timed(model, ids, hp: Hyperparameters, rms: dict, where: torch.device, graphs: bool) -> dict:
    """One static and one dynamic pass over ``ids``, timed after a warm-up of both."""
    # warm-up on every window length each pass will meet (full windows and the last, shorter one): a first use
    # that probes, compiles or captures (auto's probe on CPU, Triton's JIT, CUDA graphs) must not be timed
    n, tokens = hp.segment_length, len(ids) - 1
    static_pass(model, ids[: STATIC_WINDOW + tokens % STATIC_WINDOW + 1])
    dynamic_evaluate(model, ids[: 4 * n + tokens % n + 1], hp, rms)
    _sync(where)
    start = time.perf_counter()
    static = static_pass(model, ids, bptt=STATIC_WINDOW)
    _sync(where)
    static_s = time.perf_counter() - start
    start = time.perf_counter()
    result = dynamic_evaluate(model, ids, hp, rms, static=static)
    _sync(where)
    dynamic_s = time.perf_counter() - start
    return {"cuda_graphs": graphs, "static_seconds": static_s, "dynamic_seconds": dynamic_s,
            "cost": dynamic_s / static_s, "static_tokens_per_s": tokens / static_s,
            "dynamic_tokens_per_s": tokens / dynamic_s, "static_xent": result.static.xent,
            "dynamic_xent": result.scores.xent}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="ptb-word-mogrifier-paper")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tokens", type=int, default=10000)
    parser.add_argument("--segment-length", type=int, default=20)
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also profile both passes over the first N tokens")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    report = measure(args.config, args.device, args.tokens, args.segment_length, args.profile)
    out = Path(args.out or HERE / "results" / f"dyneval_cost_{torch.device(args.device).type}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    for row in (report, report.get("graphs")):
        if row:
            print(f"{args.config} on {args.device}{' as CUDA graphs' if row['cuda_graphs'] else ''}: static "
                  f"{row['static_tokens_per_s']:,.0f} tok/s, dynamic {row['dynamic_tokens_per_s']:,.0f} tok/s: "
                  f"dynamic evaluation costs {row['cost']:.2f}x static")
    for way, row in report.get("profile", {}).items():
        print(f"\n{way} pass profiled over {row['tokens']} tokens: {row['wall_per_token_ms']:.3f} ms per token, GPU busy "
              f"{row['gpu_busy_per_token_ms']:.3f} ms, {row['kernel_launches_per_token']:.1f} kernel launches")
        for name, op in row["top_host_ops"].items():
            print(f"  host {op['self_ms'] / row['tokens']:8.4f} ms/token {op['calls']:6d}x  {name[:100]}")
        for name, kernel in row["top_kernels"].items():
            print(f"  GPU  {kernel['ms'] / row['tokens']:8.4f} ms/token {kernel['launches']:6d}x  {name[:100]}")
    print(f"written to {out}")
    return report


if __name__ == "__main__":
    main()
