"""Microseconds per step of the Mogrifier's five low-rank rounds on CUDA, each way: two cuBLAS products and
a Triton pointwise kernel per round; one kernel per round (``moglm.recurrence.triton_rounds``); and one
kernel for all the rounds of the step (``moglm.recurrence.triton_step_rounds``) at several launch shapes,
in fp32, TF32 and (the step kernel) bf16 products.

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
#: launch shapes of the one-kernel step (moglm.recurrence.triton_step_rounds.CONFIG is the first)
STEP_CONFIGS = [
    {"BLOCK_B": 16, "BLOCK_C": 32, "num_warps": 8, "num_stages": 2},
    {"BLOCK_B": 16, "BLOCK_C": 64, "num_warps": 8, "num_stages": 1},
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


def measure(B: int, n: int, k: int, rounds: int = 5, precisions=("fp32", "tf32", "bf16")) -> list[dict]:
    """Microseconds per step (all ``rounds`` rounds of one step, forward and backward) of each path."""
    from moglm.recurrence import triton_step_rounds
    from moglm.recurrence.gemm import low_precision_products
    from moglm.recurrence.triton_step_rounds import StepChains, TritonStepRounds, step_weights

    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    nq, nr = (rounds + 1) // 2, rounds // 2

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, device=dev, generator=gen) * scale

    p = {"mogrifier_q_left": randn(nq, n, k, scale=k**-0.5), "mogrifier_q_right": randn(nq, k, n, scale=n**-0.5),
         "mogrifier_r_left": randn(nr, n, k, scale=k**-0.5), "mogrifier_r_right": randn(nr, k, n, scale=n**-0.5),
         "mogrifier_q_bias": randn(nq, n), "mogrifier_r_bias": randn(nr, n)}
    w = step_weights(p, n, n, zigzag=True)
    ch = StepChains(randn(B, n), randn(B, n), randn(nq - 1, B, n), randn(nr - 1, B, n), randn(B, 2 * n),
                    randn(nq, B, n), randn(nr, B, n))
    low, dlow = randn(rounds, B, k), randn(rounds, B, k)
    dxh, dpx, dph, dx, dh = randn(B, 2 * n), randn(nq, B, n), randn(nr, B, n), randn(B, n), randn(B, n)
    plan = [w.round(i) for i in range(1, rounds + 1)]
    chain = {"x": [ch.x0, *ch.xc, ch.xh[:, :n]], "h": [ch.h0, *ch.hc, ch.xh[:, n:]]}

    def cublas_forward():  # the per-round path: two cuBLAS products and a pointwise kernel per round
        for i, (target, j, right, left, bias) in enumerate(plan, 1):
            src = chain["h" if target == "x" else "x"][w.source_index(i)]
            TritonPointwise.round_forward(torch.addmm(bias, src @ right.t(), left.t()), chain[target][j],
                                          ch.gate(target, j), chain[target][j + 1])

    def cublas_backward():
        grad = {"x": dxh[:, :n], "h": dxh[:, n:]}
        for i, (target, j, right, left, _) in reversed(list(enumerate(plan, 1))):
            dp = (dpx if target == "x" else dph)[j]
            grad[target] = TritonPointwise.round_backward(grad[target], chain[target][j], ch.gate(target, j), dp)
            source = "h" if target == "x" else "x"
            grad[source] = torch.addmm(grad[source], dp @ left, right)

    def round_kernels_forward():
        for i, (target, j, right, left, bias) in enumerate(plan, 1):
            src = chain["h" if target == "x" else "x"][w.source_index(i)]
            triton_rounds.TritonRounds.forward(src, right, left, bias, chain[target][j], ch.gate(target, j),
                                               chain[target][j + 1])

    def round_kernels_backward():
        grad = {"x": dxh[:, :n], "h": dxh[:, n:]}
        for i, (target, j, right, left, _) in reversed(list(enumerate(plan, 1))):
            source = "h" if target == "x" else "x"
            grad[target], _, grad[source] = triton_rounds.TritonRounds.backward(
                grad[target], chain[target][j], ch.gate(target, j), (dpx if target == "x" else dph)[j], left,
                right, grad[source])

    rows = []
    for precision in precisions:
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        with low_precision_products(torch.bfloat16 if precision == "bf16" else None):
            if precision != "bf16":
                rows.append({"variant": "cuBLAS products + pointwise kernel, per round", "precision": precision,
                             "forward_us": graph_us(cublas_forward), "backward_us": graph_us(cublas_backward)})
                rows.append({"variant": "one kernel per round", "precision": precision,
                             "forward_us": graph_us(round_kernels_forward),
                             "backward_us": graph_us(round_kernels_backward)})
            for config in STEP_CONFIGS:
                triton_step_rounds.CONFIG = dict(config)
                fwd = graph_us(lambda: TritonStepRounds.forward(w, ch, low))
                bwd = graph_us(lambda: TritonStepRounds.backward(w, ch, dxh, dpx, dph, dlow, dx, dh, None))
                rows.append({"variant": f"one kernel per step {config}", "precision": precision,
                             "forward_us": fwd, "backward_us": bwd})
    torch.backends.cuda.matmul.allow_tf32 = False
    return rows


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--hidden-size", type=int, default=650)
    parser.add_argument("--rank", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--precision", nargs="+", default=["fp32", "tf32", "bf16"], choices=["fp32", "tf32", "bf16"])
    parser.add_argument("--out", default=str(HERE / "results" / "round_kernels_cuda.json"))
    args = parser.parse_args(argv)
    rows = measure(args.batch_size, args.hidden_size, args.rank, args.rounds, args.precision)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"config": vars(args), "gpu": torch.cuda.get_device_name(),
                               "torch": torch.__version__, "results": rows}, indent=1))
    print("| variant | precision | forward us per step | backward us per step |\n| --- | --- | ---: | ---: |")
    for r in rows:
        bwd = "-" if r["backward_us"] is None else f"{r['backward_us']:.1f}"
        print(f"| {r['variant']} | {r['precision']} | {r['forward_us']:.1f} | {bwd} |")
    print(f"written to {out}")
    return rows


if __name__ == "__main__":
    main()
