"""One Mogrifier layer's compiled forward window on every per-step GEMM route the class probe ranks, per step,
at window lengths from one token up, beside the probe's own timings (docs/fused-recurrence.md, "Choosing per
shape class"). A window packs its weights once, so at one-token steps (compression, generation) a route that
packs pays its packing at every step: the probe has to time the products in windows of the layer's steps.

    python benchmarks/window_routes.py                         # H = 64, rank 32, B = 198, T = 1 and 64; seconds
    python benchmarks/window_routes.py --hidden-size 256 --rank 64 --batch 64 --steps 1 --out /tmp/routes.json

For each ``--steps`` T: ``compiled.class_route``'s timings of the layer's per-step products on every route
(what ``auto`` ranks before it times whole windows; ``probe_seconds``), then the window itself (eval, no
gradient) on each of those routes, the routes interleaved, ``--repeats`` times, each timing
``--windows`` windows; the median milliseconds per step. Writes JSON (``--out``) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

import moglm
from moglm.bench import command_line, write_report


def window_ms(cell, params, xs, state, route: str, windows: int) -> float:
    """Milliseconds per step of ``windows`` forward windows of ``xs`` on ``route`` (no gradient)."""
    from moglm.recurrence import COMPILED
    from moglm.recurrence.compiled import routes
    from moglm.recurrence.compiled.functions import run_compiled
    from moglm.recurrence.fused_lstm import layer_spec

    spec, code = layer_spec(cell, params), routes.stored_route(route)
    with torch.no_grad():
        start = time.perf_counter()
        for _ in range(windows):
            run_compiled(COMPILED[type(cell)], spec, cell, params, xs, state, None, route=code)
        return (time.perf_counter() - start) / windows / xs.shape[0] * 1e3


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=198)
    parser.add_argument("--steps", type=int, action="append", help="window lengths (repeatable; default 1 and 64)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--windows", type=int, default=200, help="windows per timing at T = 1 (fewer for longer)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    import moglm.recurrence as recurrence
    from moglm.recurrence import compiled

    if not compiled.available():
        raise SystemExit(f"the compiled recurrence is unavailable: {compiled.unavailable_reason()}")
    torch.set_num_threads(args.threads)
    H = args.hidden_size
    model = moglm.MogrifierLSTM(H, H, rounds=args.rounds, rank=args.rank).eval()
    cell, params = model.cells[0], model.layer_parameters(0)
    report = {"command": command_line(), "machine": dict(platform=platform.platform(), torch=torch.__version__,
                                                         threads=torch.get_num_threads()),
              "recurrence": compiled.info(paths=False), "hidden_size": H, "rank": args.rank, "rounds": args.rounds,
              "batch": args.batch, "results": []}
    gen = torch.Generator().manual_seed(0)
    for steps in args.steps or [1, 64]:
        xs = torch.randn(steps, args.batch, H, generator=gen)  # [T, B, H]
        state = tuple(torch.zeros(args.batch, H) for _ in range(2))  # ([B, H], [B, H])
        chosen, probe = recurrence._class_route(cell, params, xs, False)
        windows = max(2, args.windows // steps)
        times: dict[str, list[float]] = {route: [] for route in probe}
        for route in probe:  # warm-up: oneDNN's JIT, the workspace cache
            window_ms(cell, params, xs, state, route, 2)
        for repeat in range(args.repeats):
            for route in (probe if repeat % 2 == 0 else reversed(list(probe))):
                times[route].append(window_ms(cell, params, xs, state, route, windows))
        for route, seconds in probe.items():
            report["results"].append({"steps": steps, "route": route, "probe_seconds": seconds,
                                      "probe_choice": route == chosen,
                                      "ms_per_step": statistics.median(times[route])})
    print(f"Mogrifier layer H={H}, rank {args.rank}, B={args.batch}, {args.threads} threads, forward only\n")
    print("| T | route | probe's product time (ms) | probe's choice | window ms per step |")
    print("| ---: | --- | ---: | --- | ---: |")
    for row in report["results"]:
        print(f"| {row['steps']} | {row['route']} | {row['probe_seconds'] * 1e3:.3f} | "
              f"{'yes' if row['probe_choice'] else ''} | {row['ms_per_step']:.3f} |")
    write_report(report, args.out)
    if args.out:
        print(f"written to {args.out}")
    return report


if __name__ == "__main__":
    main()
