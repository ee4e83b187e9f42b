"""What one time step costs, by implementation technique (the measurements behind docs/fused-recurrence.md).

    python benchmarks/step_overhead.py            # ~1 minute (+ ~1 minute to build the C++ variant)
    python benchmarks/step_overhead.py --no-cpp

For the LSTM cell's pointwise step (gates ``[B, 4n]`` -> c, h; about ten elementwise ops) at B=64 and
n = 8, 256, 650 it times, best of many calls:

* ``eager, allocating``: the reference formulation (``chunk``, ``sigmoid``, ``tanh``, new tensors);
* ``eager, out= buffers``: moglm's fused path (in-place ops into preallocated buffers, sigmoid-only);
* ``TorchScript``: ``torch.jit.script`` of the reference formulation (deprecated in torch 2.13);
* ``torch.compile``: Inductor's fused C++ kernel for the same function;
* ``C++ extension``: the same ATen calls as the eager ``out=`` variant, from C++ (no Python per op).

and, for scale, the step's GEMM (``[B, n] @ [n, 4n]`` through oneDNN) and elementwise op costs
(``torch.tanh`` vs ``torch.sigmoid``) at the same sizes. n = 8 isolates the fixed per-call overhead.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import torch

from moglm.recurrence.fused_cell import cell_forward
from moglm.recurrence.gemm import Linear

HERE = Path(__file__).resolve().parent

CPP = r"""
#include <torch/extension.h>
void cell_forward(torch::Tensor g, torch::Tensor c_prev, torch::Tensor c_out, torch::Tensor h_out, torch::Tensor tc) {
  auto n = c_prev.size(1);
  g.sigmoid_();
  auto i = g.narrow(1, 0, n), f = g.narrow(1, n, n), o = g.narrow(1, 2 * n, n), j = g.narrow(1, 3 * n, n);
  j.mul_(2.0).sub_(1.0);
  at::mul_out(c_out, f, c_prev).addcmul_(i, j);
  at::mul_out(tc, c_out, 2.0).sigmoid_().mul_(2.0).sub_(1.0);
  at::mul_out(h_out, o, tc);
}
"""


def reference_pointwise(gates: torch.Tensor, c_prev: torch.Tensor):
    i, f, j, o = gates.chunk(4, dim=-1)
    i, f, o = torch.sigmoid(i), torch.sigmoid(f), torch.sigmoid(o)
    j = torch.tanh(j)
    c = f * c_prev + i * j
    return o * torch.tanh(c), c


def best_us(fn, setup=None, calls: int = 300) -> float:
    best = float("inf")
    for _ in range(5):
        if setup:
            setup()
        fn()
    for _ in range(calls):
        if setup:
            setup()
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e6


def measure(cpp: bool) -> dict:
    results: dict = {"threads": torch.get_num_threads(), "torch": torch.__version__, "sizes": {}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scripted = torch.jit.script(reference_pointwise)
    compiled = torch.compile(reference_pointwise, dynamic=False)
    ext = None
    if cpp:
        try:
            from torch.utils.cpp_extension import load_inline

            start = time.perf_counter()
            ext = load_inline("moglm_step_overhead", CPP, functions=["cell_forward"], verbose=False)
            results["cpp_build_s"] = time.perf_counter() - start
        except Exception as error:  # a missing compiler is a result too
            results["cpp_error"] = repr(error)
    for n in (8, 256, 650):
        B = 64
        g0 = torch.randn(B, 4 * n)
        g = g0.clone()
        c_prev, c_out, h_out, tc = (torch.randn(B, n) for _ in range(4))
        x, w = torch.randn(B, n), torch.randn(4 * n, n)
        gemm = Linear(w, None, B)
        reset = lambda: g.copy_(g0)  # noqa: E731
        row = {
            "eager, allocating": best_us(lambda: reference_pointwise(g0, c_prev)),
            "eager, out= buffers": best_us(lambda: cell_forward(g, c_prev, c_out, h_out, tc, False), reset)
            - best_us(reset),
            "TorchScript": best_us(lambda: scripted(g0, c_prev)),
            "torch.compile": best_us(lambda: compiled(g0, c_prev)),
            "gemm [B,n]@[n,4n]": best_us(lambda: gemm(x)),
            "torch.tanh [B,n]": best_us(lambda: torch.tanh(c_prev, out=tc)),
            "torch.sigmoid [B,n]": best_us(lambda: torch.sigmoid(c_prev, out=tc)),
            "torch.mul [B,n]": best_us(lambda: torch.mul(c_prev, c_out, out=tc)),
        }
        if ext is not None:
            row["C++ extension"] = best_us(lambda: ext.cell_forward(g, c_prev, c_out, h_out, tc), reset) - best_us(reset)
        results["sizes"][n] = row
    return results


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-cpp", action="store_true", help="skip the C++ extension variant")
    parser.add_argument("--out", default=str(HERE / "results" / "step_overhead.json"))
    args = parser.parse_args(argv)
    results = measure(cpp=not args.no_cpp)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    names = list(next(iter(results["sizes"].values())))
    print("| µs per call (best of 300), B=64 | " + " | ".join(f"n={n}" for n in results["sizes"]) + " |")
    print("| --- |" + " ---: |" * len(results["sizes"]))
    for name in names:
        print(f"| {name} | " + " | ".join(f"{row.get(name, float('nan')):.1f}" for row in results["sizes"].values()) + " |")
    if "cpp_build_s" in results:
        print(f"\nC++ extension build: {results['cpp_build_s']:.0f} s")
    return results


if __name__ == "__main__":
    main()
