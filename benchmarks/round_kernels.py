"""Microseconds per launch of one low-rank Mogrifier round on CUDA, each way: the default path (two cuBLAS
products and a Triton pointwise kernel) against the one-kernel rounds of ``moglm.recurrence.triton_rounds``
at several block shapes, and split-K forms of the narrow product ``[B, in] x [in, k]``.

    python benchmarks/round_kernels.py                 # B=64, in=out=650, k=64; under a minute on an H100/H200

Each variant runs 70 times inside one captured CUDA graph (as a graphed window runs its steps), and the
graph's replay is timed with CUDA events (median of 20 replays): launch gaps on the host do not count, the
kernels' own latency does. In fp32 (TF32 off) and TF32. Writes JSON (default
``benchmarks/results/round_kernels_cuda.json``) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from moglm.recurrence import triton_rounds
from moglm.recurrence.triton_pointwise import TritonPointwise

HERE = Path(__file__).resolve().parent
CONFIGS = [
    {"BLOCK_B": 16, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4},
    {"BLOCK_B": 16, "BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4},
    {"BLOCK_B": 32, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4},
    {"BLOCK_B": 64, "BLOCK_N": 32, "BLOCK_K": 64, "num_warps": 4},
]


def graph_us(fn, steps: int = 70, replays: int = 20) -> float:
    """Microseconds per call of ``fn`` replayed ``steps`` times in one CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(steps):
            fn()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / steps)
    return statistics.median(times)


def measure(B: int, n: int, k: int) -> list[dict]:
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    src, old, dnew, add = (torch.randn(B, n, device=dev, generator=gen) for _ in range(4))
    right = torch.randn(k, n, device=dev, generator=gen) / n**0.5  # [k, in]
    left = torch.randn(n, k, device=dev, generator=gen) / k**0.5  # [out, k]
    bias = torch.randn(n, device=dev, generator=gen)
    sg, new, dp = (torch.empty(B, n, device=dev) for _ in range(3))
    right_t = right.t().contiguous()  # [in, k]

    def cublas_forward():
        low = src @ right.t()  # [B, k]
        TritonPointwise.round_forward(torch.addmm(bias, low, left.t()), old, sg, new)

    def cublas_backward():
        TritonPointwise.round_backward(dnew, old, sg, dp)
        torch.addmm(add, dp @ left, right)

    rows = []
    for tf32 in (False, True):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        precision = "tf32" if tf32 else "fp32"
        cublas_forward()
        rows.append({"variant": "cuBLAS products + pointwise kernel", "precision": precision,
                     "forward_us": graph_us(cublas_forward), "backward_us": graph_us(cublas_backward)})
        rows.append({"variant": "cuBLAS [B,in]x[in,k] alone", "precision": precision,
                     "forward_us": graph_us(lambda: src @ right.t()), "backward_us": None})
        for splits in (5, 10, 13, 25):
            if n % splits:
                continue
            a = src.view(B, splits, n // splits)
            w = right_t.view(splits, n // splits, k)
            rows.append({"variant": f"split-K x{splits}: bmm + sum", "precision": precision,
                         "forward_us": graph_us(lambda: torch.bmm(a.transpose(0, 1), w).sum(0)), "backward_us": None})
        for config in CONFIGS:
            triton_rounds.CONFIG = dict(config)
            fwd = graph_us(lambda: triton_rounds.TritonRounds.forward(src, right, left, bias, old, sg, new))
            bwd = graph_us(lambda: triton_rounds.TritonRounds.backward(dnew, old, sg, dp, left, right, add))
            rows.append({"variant": f"one-kernel round {config}", "precision": precision, "forward_us": fwd,
                         "backward_us": bwd})
    torch.backends.cuda.matmul.allow_tf32 = False
    return rows


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--hidden-size", type=int, default=650)
    parser.add_argument("--rank", type=int, default=64)
    parser.add_argument("--out", default=str(HERE / "results" / "round_kernels_cuda.json"))
    args = parser.parse_args(argv)
    rows = measure(args.batch_size, args.hidden_size, args.rank)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"config": vars(args), "gpu": torch.cuda.get_device_name(),
                               "torch": torch.__version__, "results": rows}, indent=1))
    print("| variant | precision | forward us | backward us |\n| --- | --- | ---: | ---: |")
    for r in rows:
        bwd = "-" if r["backward_us"] is None else f"{r['backward_us']:.1f}"
        print(f"| {r['variant']} | {r['precision']} | {r['forward_us']:.1f} | {bwd} |")
    print(f"written to {out}")
    return rows


if __name__ == "__main__":
    main()
