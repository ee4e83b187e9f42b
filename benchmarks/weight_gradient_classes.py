"""Whether one weight-gradient route serves every width: every model's training step with the products after the
loop pinned to at::mm and to oneDNN's ukernel, in turns, in one process, at several widths
(docs/performance/amd-epyc-zen4.md, "One weight-gradient route for every width";
``moglm.recurrence.compiled.routes.weight_gradient_route``, which a machine probes once, at a layer 256 wide).

    python benchmarks/weight_gradient_classes.py                       # H = 256, 650, 1024 (B=64, T=70); ~6 minutes
    python benchmarks/weight_gradient_classes.py --hidden-size 650 --repeats 9 --out classes.json

For each H and model (moglm's LSTM, Mogrifier r=5 k=64 and multiplicative LSTM on the default backend), a
repeat times one training step (forward and backward) with each route pinned, the two in turn (which goes
first alternates from repeat to repeat), after two warm-up steps of each. Per cell: the median step on each
route, the paired ratio at::mm / ukernel repeat by repeat (above 1: the ukernel is faster) with its median
and 95% interval, and the route this machine's probe stored with the probe's own timings. Writes JSON
(``--out``) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from moglm.bench import command_line, write_report
from moglm.bench.throughput import _time_once, build, median_interval
from moglm.provenance import cpu_name
from moglm.recurrence import compiled
from moglm.recurrence.compiled import routes

MODELS = ("moglm LSTM", "moglm Mogrifier r=5 k=64", "moglm multiplicative LSTM")
ROUTES = ("aten", "brgemm")


def measure(name: str, hidden: int, batch: int, bptt: int, repeats: int) -> dict:
    """One model's training steps with each weight-gradient route pinned, in turns."""
    torch.manual_seed(0)
    model = build(name, hidden)
    x = torch.randn(bptt, batch, hidden, requires_grad=True)
    seconds: dict[str, list[float]] = {route: [] for route in ROUTES}
    for i, timed in enumerate([False] * 2 + [True] * repeats):
        for route in ROUTES if i % 2 == 0 else ROUTES[::-1]:  # neither always first
            with routes.pinned_weight_gradient_route(route):
                took = _time_once(model, x, train=True, device="cpu")
            if timed:
                seconds[route].append(took)
    ratios = [a / b for a, b in zip(seconds["aten"], seconds["brgemm"])]
    ratio, interval = statistics.median(ratios), median_interval(ratios)
    return {"model": name, "hidden": hidden,
            "aten_ms": 1e3 * statistics.median(seconds["aten"]),
            "brgemm_ms": 1e3 * statistics.median(seconds["brgemm"]),
            "aten_over_brgemm": ratio,
            "interval": list(interval) if interval is not None else None,
            "machine_route": routes.route_name(routes.weight_gradient_route(torch.float32)),
            "probe_seconds": routes.probe_seconds(torch.float32, "weight_gradient_route"),
            "faster_here": "brgemm" if ratio > 1 else "aten", "seconds": seconds}


def markdown_table(rows: list[dict]) -> str:
    out = ["| H | model | at::mm ms | ukernel ms | at::mm / ukernel (95% interval) | this machine's route |",
           "| ---: | --- | ---: | ---: | --- | --- |"]
    for r in rows:
        interval = "" if r["interval"] is None else f" ({r['interval'][0]:.3f}-{r['interval'][1]:.3f})"
        out.append(f"| {r['hidden']} | {r['model']} | {r['aten_ms']:.1f} | {r['brgemm_ms']:.1f} | "
                   f"{r['aten_over_brgemm']:.3f}{interval} | {r['machine_route']} |")
    return "\n".join(out)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden-size", type=int, action="append", help="H (repeatable; default 256, 650, 1024)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--bptt", type=int, default=70)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--model", action="append", choices=MODELS, help="repeatable; default all three")
    parser.add_argument("--out", help="where the JSON report goes")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if not compiled.available() or "brgemm" not in compiled.candidate_routes(torch.float32):
        parser.error("this needs the compiled recurrence and oneDNN's float32 ukernel (moglm info says why not)")
    rows = []
    for hidden in args.hidden_size or [256, 650, 1024]:
        for name in args.model or MODELS:
            row = measure(name, hidden, args.batch_size, args.bptt, args.repeats)
            print(f"H={hidden} {name}: at::mm {row['aten_ms']:.1f} ms, ukernel {row['brgemm_ms']:.1f} ms, "
                  f"ratio {row['aten_over_brgemm']:.3f}, this machine's route {row['machine_route']}", flush=True)
            rows.append(row)
    report = {"command": command_line(), "cpu": cpu_name(),
              "threads": torch.get_num_threads(), "batch": args.batch_size, "bptt": args.bptt,
              "repeats": args.repeats, "compiled": compiled.info(paths=False), "rows": rows}
    print(markdown_table(rows))
    write_report(report, args.out)
    return report


if __name__ == "__main__":
    main()
