"""GFLOP/s of the compiled recurrence's GEMM routes (ATen, BLAS, MKL packed, moglm's panel kernel) at the
products a window runs per step; writes benchmarks/results/gemm_routes.json.

    python benchmarks/gemm_routes.py                     # moglm bench gemm-routes, into benchmarks/results/; about a minute
"""

from __future__ import annotations

from moglm.cli import main

if __name__ == "__main__":
    import sys

    sys.exit(main(["bench", "gemm-routes", "--out", "benchmarks/results/gemm_routes.json", *sys.argv[1:]]))
