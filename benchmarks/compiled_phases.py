"""Where a training step of the compiled CPU window goes, by phase, as % of the GEMM peak (issue 25: "if a
target is missed, show the % of peak per phase").

    python benchmarks/compiled_phases.py                         # H = 256, 650, 1024 (B=64, T=70); ~3 minutes
    python benchmarks/compiled_phases.py --hidden-size 650 --out /tmp/phases.json

For moglm's LSTM, Mogrifier (r=5, k=64) and multiplicative LSTM on the default backend (``auto``: the path
and route stored for the class on this machine, as ``moglm bench throughput`` runs them) and for
``torch.nn.LSTM``, the best of ``--repeats`` timings of three phases of one window:

* ``forward``: the training forward (it saves what the backward reads), with the products before the loop;
* ``weight gradients``: every weight gradient over all T*B rows, as the backward computes them after its
  loop (``time_product_tn`` on this machine's weight-gradient route, at the model's shapes);
* ``backward, data``: the whole backward less those: the sequential loop (the cell's and the rounds'
  derivatives, the per-step data-gradient products), the input's gradient (after the loop where it does
  not depend on the recurrence), the bias sums, allocation.

Each phase's matrix-product FLOPs (counted from the shapes, below) divided by its time and by the measured
GEMM peak (``moglm.bench.throughput.gemm_peak``) give its % of peak; the rest of a phase's time is
pointwise work, memory (fresh buffers are page-faulted in), packing and synchronisation. ``nn.LSTM`` is
one fused oneDNN call per pass, so it has the forward and the whole backward only. Writes JSON
(``--out``) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

import moglm
from moglm.bench import command_line, write_report
from moglm.bench.throughput import gemm_peak

MODELS = ("torch.nn.LSTM", "moglm LSTM", "moglm Mogrifier r=5 k=64", "moglm multiplicative LSTM")


def build(name: str, hidden: int) -> torch.nn.Module:
    return {
        "torch.nn.LSTM": lambda: torch.nn.LSTM(hidden, hidden),
        "moglm LSTM": lambda: moglm.LSTM(hidden, hidden),
        "moglm Mogrifier r=5 k=64": lambda: moglm.MogrifierLSTM(hidden, hidden, rounds=5, rank=64),
        "moglm multiplicative LSTM": lambda: moglm.MultiplicativeLSTM(hidden, hidden),
    }[name]()


def phase_flops(name: str, rows: int, n: int, rounds: int = 5, rank: int = 64) -> dict[str, float]:
    """Matrix-product FLOPs of each phase over ``rows`` = T*B rows, input size = hidden size = n."""
    m = n
    gates_x, gates_h = 2 * rows * m * 4 * n, 2 * rows * n * 4 * n  # W_ih x, W_hh h (or m_t)
    if name in ("torch.nn.LSTM", "moglm LSTM"):
        return {"forward": gates_x + gates_h, "backward, data": gates_h + gates_x,  # dG W_hh per step; dG W_ih
                "weight gradients": gates_x + gates_h}
    if name == "moglm Mogrifier r=5 k=64":
        round_products = rounds * 2 * (2 * rows * n * rank)  # per round: src -> low -> out
        return {"forward": gates_x + gates_h + round_products,
                "backward, data": gates_x + gates_h + round_products,  # [dx_up; dh_up], the rounds' data
                "weight gradients": gates_x + gates_h + round_products}
    proj = 2 * rows * m * n  # W_mx x, W_mh h~: n x n each (m = n)
    return {"forward": proj + gates_x + proj + gates_h,  # W_mx x and W_ih x before the loop; W_mh h~, W_hh m
            "backward, data": gates_h + proj + gates_x + proj,  # dm = dG W_hh, dh~ per step; dx after
            "weight gradients": gates_x + gates_h + proj + proj}  # dW_ih, dW_hh, dW_mx, dW_mh


def weight_gradient_shapes(name: str, n: int, rounds: int = 5, rank: int = 64) -> list[tuple[int, int]]:
    """``(N, K)`` of each weight gradient ``A^T B`` (A ``[rows, N]``, B ``[rows, K]``), input size = n."""
    m = n
    if name in ("torch.nn.LSTM", "moglm LSTM"):
        return [(4 * n, m + n)]  # dG^T [x; h~]
    if name == "moglm Mogrifier r=5 k=64":
        return [(4 * n, m + n)] + [(rank, n), (n, rank)] * rounds  # dG^T [x_up; h_up]; per round right, left
    return [(4 * n, m), (4 * n, n), (n, m), (n, n)]  # W_ih, W_hh, W_mx, W_mh


def weight_gradient_seconds(name: str, rows: int, n: int, repeats: int) -> float:
    from moglm.recurrence import compiled

    route = compiled.weight_gradient_route(torch.float32)
    return sum(min(torch.ops.moglm.time_product_tn(route, rows, a, b, 1) for _ in range(repeats))
               for a, b in weight_gradient_shapes(name, n))


def _best(run, repeats: int) -> float:
    run()  # warm-up (and auto's probe where the class has no stored choice)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def measure(name: str, hidden: int, batch: int, bptt: int, repeats: int) -> dict[str, float]:
    """Seconds of each phase (module docstring)."""
    torch.manual_seed(0)
    model = build(name, hidden)
    x = torch.randn(bptt, batch, hidden)
    h0 = torch.zeros(1, batch, hidden)

    def forward():
        y, _ = model(x.clone().requires_grad_(), (h0.clone(), h0.clone()))
        return y

    def loss(y):
        return y.float().sum()

    out = {"forward": _best(forward, repeats)}
    full = _best(lambda: loss(forward()).backward(), repeats) - out["forward"]
    if name == "torch.nn.LSTM":
        out["backward"] = full
        return out
    out["weight gradients"] = weight_gradient_seconds(name, batch * bptt, hidden, repeats)
    out["backward, data"] = full - out["weight gradients"]
    out["backward"] = full
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden-size", type=int, action="append", help="repeatable; default 256, 650, 1024")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--bptt", type=int, default=70)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results/compiled_phases.json")
    args = parser.parse_args(argv)
    from moglm.recurrence import compiled
    from moglm.recurrence.compiled import routes

    peak = gemm_peak()
    report = {"command": command_line(), "machine": dict(platform=platform.platform(), torch=torch.__version__,
                                                         threads=torch.get_num_threads()),
              "recurrence": compiled.info(paths=False), "gemm_peak_gflops": max(peak.values()),
              "batch": args.batch_size, "bptt": args.bptt, "results": []}
    rows = args.batch_size * args.bptt
    for hidden in args.hidden_size or [256, 650, 1024]:
        for name in MODELS:
            seconds = measure(name, hidden, args.batch_size, args.bptt, args.repeats)
            flops = phase_flops(name, rows, hidden)
            flops["backward"] = flops["backward, data"] + flops["weight gradients"]
            phases = {phase: {"ms": s * 1e3, "gflops": flops[phase] / s / 1e9 if s > 0 else None,
                              "peak_pct": 100 * flops[phase] / s / 1e9 / report["gemm_peak_gflops"] if s > 0 else None}
                      for phase, s in seconds.items()}
            report["results"].append({"hidden": hidden, "model": name, "phases": phases})
            print(f"H={hidden} {name}: " + ", ".join(f"{p} {v['ms']:.1f} ms ({v['peak_pct']:.0f}% peak)"
                                                     for p, v in phases.items() if v["peak_pct"] is not None),
                  flush=True)
    report["auto_backend_choices"] = routes.backends_used()
    write_report(report, args.out)
    print(markdown_table(report))
    return report


def markdown_table(report: dict) -> str:
    phases = ("forward", "backward", "backward, data", "weight gradients")
    lines = [f"GEMM peak {report['gemm_peak_gflops']:.0f} GFLOP/s; ms per window (% of peak)", "",
             "| H | model | " + " | ".join(phases) + " |", "| ---: | --- |" + " ---: |" * len(phases)]
    for r in report["results"]:
        cells = [f"{v['ms']:.1f} ({v['peak_pct']:.0f}%)" if (v := r["phases"].get(p)) and v["peak_pct"] else "-"
                 for p in phases]
        lines.append(f"| {r['hidden']} | {r['model']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
