"""GFLOP/s of the compiled recurrence's GEMM routes at the products a window runs per step.

For each hidden size H (input = H, batch B split over the threads as the windows split it) and each
available route (:mod:`moglm.recurrence.compiled`), the best of ``repeats`` timings of ``steps``
products per thread of each shape: the forward gate product ``[x; h] @ [W_ih, W_hh]^T`` (K = 2H, N = 4H),
its backward ``dG @ [W_ih, W_hh]`` (K = 4H, N = 2H), and a rank-64 round's two products (K = H, N = 64
and K = 64, N = H). Each route's weight packing is included, once per timing, as in a window. The gate
products are also timed split by columns (``<route>+columns``: every thread all rows and its block of the
N columns, meeting the others after each product, as a column-split window runs them). Then the
weight gradient of the gates after the loop, ``dG^T [x; h~]`` over all ``batch * steps`` rows
(``[4H, 2H]``), as each route computes it (oneDNN's ukernel on ``brgemm``, ``at::mm`` on the others).
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any, Callable

import torch

from . import command_line, write_report


def shapes(hidden: int, rank: int = 64) -> dict[str, tuple[int, int]]:
    return {"gate forward": (2 * hidden, 4 * hidden), "gate backward": (4 * hidden, 2 * hidden),
            "round x -> low": (hidden, rank), "round low -> out": (rank, hidden)}


def run_gemm_routes(hidden_sizes=(256, 650, 1024), batch: int = 64, steps: int = 70, repeats: int = 3,
                    out_path: str | Path | None = "benchmarks/results/gemm_routes.json",
                    log: Callable[[str], None] = print) -> dict[str, Any]:
    from ..recurrence import compiled

    if not compiled.available():
        raise RuntimeError(f"the compiled recurrence is unavailable: {compiled.unavailable_reason()}")
    routes = compiled.candidate_routes(torch.float32)
    report: dict[str, Any] = {
        "command": command_line(),
        "machine": dict(platform=platform.platform(), torch=torch.__version__, threads=torch.get_num_threads(),
                        cpus=os.cpu_count()),
        "recurrence": compiled.info(paths=False), "batch": batch, "steps": steps, "results": [],
    }
    for hidden in hidden_sizes:
        for name, (k, n) in shapes(hidden).items():
            row = {"hidden": hidden, "product": name, "K": k, "N": n, "gflops": {}}
            split = name.startswith("gate") and torch.ops.moglm.column_partitions(hidden) > 1
            for route in routes + ([r + compiled.COLUMNS_SUFFIX for r in routes] if split else []):
                code = compiled.route_code(route)
                best = min(compiled.routes.time_route(code, batch, k, n, steps, False, hidden)
                           for _ in range(repeats))
                row["gflops"][route] = 2 * batch * k * n * steps / best / 1e9
            report["results"].append(row)
            log(f"H={hidden} {name}: " + ", ".join(f"{r} {g:.0f}" for r, g in row["gflops"].items()))
        rows, n, k = batch * steps, 4 * hidden, 2 * hidden
        row = {"hidden": hidden, "product": "weight gradient", "K": rows, "N": n, "M": k, "gflops": {}}
        for route in routes:
            best = min(torch.ops.moglm.time_product_tn(compiled.ROUTES[route], rows, n, k, 1) for _ in range(repeats))
            row["gflops"][route] = 2 * rows * n * k / best / 1e9
        report["results"].append(row)
        log(f"H={hidden} {row['product']}: " + ", ".join(f"{r} {g:.0f}" for r, g in row["gflops"].items()))
    write_report(report, out_path)
    return report


def markdown_table(report: dict[str, Any]) -> str:
    routes = list(dict.fromkeys(route for r in report["results"] for route in r["gflops"]))
    lines = ["| H | product (K -> N) | " + " | ".join(routes) + " |", "| ---: | --- |" + " ---: |" * len(routes)]
    for r in report["results"]:
        best = max(r["gflops"].values())
        cells = ["-" if (g := r["gflops"].get(route)) is None else f"**{g:.0f}**" if g == best else f"{g:.0f}"
                 for route in routes]
        shape = f"({r['K']} -> {r['N']})" if "M" not in r else f"({r['K']} rows -> [{r['N']}, {r['M']}])"
        lines.append(f"| {r['hidden']} | {r['product']} {shape} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
