"""Where the time of one training step of the Python fused window goes (what CUDA runs, and CPU without a
compiler): torch.profiler over forward+backward, by kind of op. The compiled CPU window is one op to
torch.profiler; docs/fused-recurrence.md profiles it with perf instead.

    python benchmarks/profile_fused.py                 # H=650 (B=64, T=70); ~1 minute
    python benchmarks/profile_fused.py --hidden-size 256
    python benchmarks/profile_fused.py --device cuda   # also the GPU kernels: time, launches, top kernels

For torch.nn.LSTM, and moglm's LSTM and Mogrifier (r=5, k=64) on the Python fused window, it profiles a few forward+backward
passes (after a warm-up) and sums the self time of every op into: matrix products (oneDNN/MKL GEMMs and
nn.LSTM's fused oneDNN RNN kernels), pointwise math (sigmoid, tanh, mul, add, ...), copies and layout
(copy_, transposes, cat, index_select, ...), allocation, and the rest. The wall time not spent inside any op
is Python outside ops and the profiler's own cost (the profiled step is slower than the unprofiled one,
which is reported beside it); the self time of moglm's autograd.Function is the Python of the fused loop
between its ops. Writes ``benchmarks/results/profile_fused.json`` and prints a markdown
table (ms per step, median of the passes' totals).

On CUDA (``--device cuda``; default models there: cuDNN's nn.LSTM, moglm's LSTM, Mogrifier and multiplicative
LSTM, and the Mogrifier as CUDA graphs) it also sums the GPU kernels: their busy time per step (the time the
GPU computes; a step whose wall time is far above it waits on launches from the host), kernel launches per
step, and the top kernels by GPU time.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from moglm.bench.profiling import split_events
from moglm.bench.throughput import PRECISIONS, build, precision

HERE = Path(__file__).resolve().parent
MODELS = ("torch.nn.LSTM", "LSTM, Python fused", "Mogrifier, Python fused")
CUDA_MODELS = ("torch.nn.LSTM", "moglm LSTM", "moglm Mogrifier r=5 k=64", "moglm multiplicative LSTM",
               "Mogrifier, CUDA graphs", "Mogrifier, CUDA graphs, step kernels")

GEMM = ("mkldnn", "mm", "addmm", "bmm", "matmul", "linear", "_linear_pointwise", "mkldnn_rnn_layer",
        "mkldnn_rnn_layer_backward")
POINTWISE = ("sigmoid", "tanh", "mul", "add", "sub", "rsub", "div", "minimum", "where", "sigmoid_backward",
             "tanh_backward", "sum", "fill_", "zero_", "mul_", "add_", "sub_", "neg", "lt", "eq", "bernoulli_",
             "copysign", "clamp")
LAYOUT = ("copy_", "contiguous", "clone", "t", "transpose", "cat", "stack", "index_select", "_reorder",
          "view", "unbind", "select", "slice", "narrow", "as_strided", "reshape", "expand", "permute",
          "_to_copy", "to", "unsqueeze", "squeeze", "split", "chunk", "detach", "alias", "_unsafe_view")
ALLOC = ("empty", "empty_like", "new_empty", "zeros", "zeros_like", "ones_like", "empty_strided", "resize_")


def category(name: str) -> str:
    op = name.split("::")[-1]
    if "Function" in op:  # the self time of moglm's autograd.Function: its Python loop between ops
        return "Python in the fused loop"
    if "reorder" in op:
        return "copies and layout"
    if op in GEMM or "linear" in op or "rnn" in op:
        return "matrix products"
    if op in POINTWISE or op.rstrip("_") in POINTWISE:
        return "pointwise math"
    if op in LAYOUT:
        return "copies and layout"
    if op in ALLOC:
        return "allocation"
    return "other ops"


def profile_model(name: str, hidden: int, batch: int, bptt: int, passes: int, device: str = "cpu") -> dict:
    cuda = device.startswith("cuda")
    model = build(name, hidden, device).train()
    x = torch.randn(bptt, batch, hidden, device=device, requires_grad=True)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        y, _ = model(x)
        y.sum().backward()
        if cuda:
            torch.cuda.synchronize()

    for _ in range(2):
        step()
    plain = []
    for _ in range(passes):
        start = time.perf_counter()
        step()
        plain.append(time.perf_counter() - start)
    walls, by_kind, by_op = [], defaultdict(float), defaultdict(float)
    kernels, launches = defaultdict(float), defaultdict(float)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    for _ in range(passes):
        with profile(activities=activities) as prof:
            start = time.perf_counter()
            step()
            walls.append(time.perf_counter() - start)
        host, gpu = split_events(prof)
        for key, (ms, n) in gpu.items():  # a GPU kernel (or memcpy/memset) and its own GPU time
            kernels[key] += ms / 1e3 / passes
            launches[key] += n / passes
        for key, (ms, _) in host.items():
            seconds = ms / 1e3 / passes
            by_kind[category(key)] += seconds
            by_op[key] += seconds
    wall = sorted(walls)[len(walls) // 2]
    in_ops = sum(by_kind.values())
    kinds = {k: 1e3 * v for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])}
    kinds["rest of the wall time"] = max(0.0, 1e3 * (wall - in_ops))
    top = sorted(by_op.items(), key=lambda kv: -kv[1])[:12]
    row = {"model": name, "hidden": hidden, "device": device, "wall_ms": 1e3 * wall,
           "unprofiled_ms": 1e3 * sorted(plain)[len(plain) // 2], "ms_by_kind": kinds,
           "top_ops_ms": {k: 1e3 * v for k, v in top}}
    if cuda:
        row["gpu_busy_ms"] = 1e3 * sum(kernels.values())
        row["kernel_launches"] = round(sum(launches.values()))
        row["top_kernels_ms"] = {k: {"ms": 1e3 * v, "launches": round(launches[k])}
                                 for k, v in sorted(kernels.items(), key=lambda kv: -kv[1])[:12]}
    return row


def markdown_table(rows: list[dict]) -> str:
    kinds = ["matrix products", "pointwise math", "copies and layout", "allocation", "other ops",
             "Python in the fused loop", "rest of the wall time"]
    lines = ["| H | model | step ms | profiled | " + " | ".join(kinds) + " |",
             "| ---: | --- | ---: | ---: | " + " | ".join("---:" for _ in kinds) + " |"]
    for r in rows:
        cells = [str(r["hidden"]), r["model"], f"{r['unprofiled_ms']:.1f}", f"{r['wall_ms']:.1f}"]
        cells += [f"{r['ms_by_kind'].get(k, 0.0):.1f}" for k in kinds]
        lines.append("| " + " | ".join(cells) + " |")
    gpu = [r for r in rows if "gpu_busy_ms" in r]
    if gpu:
        lines += ["", "| H | model | step ms | GPU busy ms | kernel launches | top kernel (ms) |",
                  "| ---: | --- | ---: | ---: | ---: | --- |"]
        for r in gpu:
            first = next(iter(r["top_kernels_ms"].items()), None)
            top = f"{first[0][:60]} ({first[1]['ms']:.2f})" if first else "-"
            lines.append(f"| {r['hidden']} | {r['model']} | {r['unprofiled_ms']:.2f} | {r['gpu_busy_ms']:.2f} | "
                         f"{r['kernel_launches']} | {top} |")
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden-size", "--hidden", dest="hidden", type=int, nargs="+", default=[650])
    parser.add_argument("--batch-size", "--batch", dest="batch", type=int, default=64)
    parser.add_argument("--bptt", type=int, default=70)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--models", nargs="+", default=None, choices=sorted({*MODELS, *CUDA_MODELS}))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32", choices=list(PRECISIONS),
                        help="products in fp32 (cuDNN's TF32 off too), tf32 (CUDA) or bf16 autocast")
    parser.add_argument("--out", default=None, help="default: benchmarks/results/profile_fused[_cuda].json")
    args = parser.parse_args(argv)
    cuda = args.device.startswith("cuda")
    args.models = args.models or list(CUDA_MODELS if cuda else MODELS)
    args.out = args.out or str(HERE / "results" / f"profile_fused{'_cuda' if cuda else ''}.json")
    torch.manual_seed(0)
    with precision(args.precision, args.device):
        rows = [profile_model(name, hidden, args.batch, args.bptt, args.passes, args.device)
                for hidden in args.hidden for name in args.models]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"config": vars(args), "threads": torch.get_num_threads(), "results": rows}, indent=1))
    print(markdown_table(rows))
    for r in rows:
        print(f"\n{r['model']} H={r['hidden']}: top ops (ms per step)")
        for op, ms in r["top_ops_ms"].items():
            print(f"  {ms:8.2f}  {op}")
        for kernel, k in r.get("top_kernels_ms", {}).items():
            print(f"  GPU {k['ms']:8.3f} ms  {k['launches']:5d}x  {kernel[:110]}")
    print(f"written to {out}")
    return rows


if __name__ == "__main__":
    main()
