"""What the compiled windows' workspace cache saves: a training step's time and page faults with the cache
on and off, in the same run (docs/fused-recurrence.md, "The workspace cache").

    python benchmarks/workspace_cache.py                      # H = 256, 650, 1024 (B=64, T=70); ~5 minutes
    python benchmarks/workspace_cache.py --hidden-size 650 --rounds 1 --out /tmp/workspace.json

The cache reads its settings once a process, so each (model, H, setting) runs in a fresh process:
``MOGLM_WORKSPACE_CACHE_MB`` unset (on, the default) or 0 (off). A process builds the model on the default
backend (``auto``: the path and route stored for the class on this machine, as ``moglm bench throughput``
runs them), takes two warm-up steps (``auto``'s probe, first-touch of the cache), then times ``--steps``
training steps (forward and backward), counting the minor page faults of each (``getrusage``:
deterministic where times are noisy). The settings alternate, ``--rounds`` times, and each keeps its
median step; ``torch.nn.LSTM`` runs beside them for scale. Writes JSON (``--out``) and prints a markdown
table with the ratio off / on (above 1: the cache is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import torch

from moglm.bench import command_line, write_report

MODELS = ("torch.nn.LSTM", "moglm LSTM", "moglm Mogrifier r=5 k=64", "moglm multiplicative LSTM")
SETTINGS = {"on": None, "off": "0"}  # MOGLM_WORKSPACE_CACHE_MB


def steps(name: str, hidden: int, batch: int, bptt: int, count: int) -> dict:
    """In this process: ``count`` timed training steps after two warm-ups; their seconds and page faults."""
    from moglm.bench.throughput import build
    from moglm.recurrence import compiled

    torch.manual_seed(0)
    model = build(name, hidden)
    x = torch.randn(bptt, batch, hidden, requires_grad=True)
    seconds, faults = [], []
    for i in range(count + 2):
        model.zero_grad(set_to_none=True)
        x.grad = None
        before, start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
        y, _ = model(x)
        y.sum().backward()
        if i >= 2:
            seconds.append(time.perf_counter() - start)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return {"seconds": seconds, "faults": faults, "workspace_cache": compiled.workspace_cache()}


def in_fresh_process(name: str, hidden: int, batch: int, bptt: int, count: int, setting: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "MOGLM_WORKSPACE_CACHE_MB"}
    if setting is not None:
        env["MOGLM_WORKSPACE_CACHE_MB"] = setting
    code = (f"import json, sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
            f"import workspace_cache as w; print(json.dumps(w.steps({name!r}, {hidden}, {batch}, {bptt}, {count})))")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{name} at H={hidden}: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden-size", type=int, action="append", help="repeatable; default 256, 650, 1024")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--bptt", type=int, default=70)
    parser.add_argument("--steps", type=int, default=5, help="timed training steps per process")
    parser.add_argument("--rounds", type=int, default=2, help="processes per setting, alternating")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--out", default="benchmarks/results/workspace_cache.json")
    args = parser.parse_args(argv)
    from moglm.recurrence import compiled

    report = {"command": command_line(), "machine": dict(platform=platform.platform(), torch=torch.__version__,
                                                         threads=torch.get_num_threads()),
              "recurrence": compiled.info(paths=False), "batch": args.batch_size, "bptt": args.bptt, "results": []}
    for hidden in args.hidden_size or [256, 650, 1024]:
        for name in args.models:
            runs: dict[str, list[dict]] = {s: [] for s in SETTINGS}
            for r in range(args.rounds):
                order = list(SETTINGS) if r % 2 == 0 else list(reversed(SETTINGS))
                for setting in order:
                    runs[setting].append(in_fresh_process(name, hidden, args.batch_size, args.bptt, args.steps,
                                                          SETTINGS[setting]))
            row = {"hidden": hidden, "model": name}
            for setting, done in runs.items():
                row[setting] = {"ms": 1e3 * statistics.median(s for d in done for s in d["seconds"]),
                                "faults_per_step": statistics.median(f for d in done for f in d["faults"]),
                                "workspace_cache": done[-1]["workspace_cache"]}
            row["off_over_on"] = row["off"]["ms"] / row["on"]["ms"]
            report["results"].append(row)
            print(f"H={hidden} {name}: on {row['on']['ms']:.1f} ms ({row['on']['faults_per_step']:.0f} faults), "
                  f"off {row['off']['ms']:.1f} ms ({row['off']['faults_per_step']:.0f} faults)", flush=True)
    write_report(report, args.out)
    print(markdown_table(report))
    return report


def markdown_table(report: dict) -> str:
    lines = [f"B={report['batch']}, T={report['bptt']}: median ms per training step and minor page faults per step",
             "", "| H | model | cache on: ms | faults | cache off: ms | faults | off / on |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in report["results"]:
        lines.append(f"| {r['hidden']} | {r['model']} | {r['on']['ms']:.1f} | {r['on']['faults_per_step']:,.0f} | "
                     f"{r['off']['ms']:.1f} | {r['off']['faults_per_step']:,.0f} | {r['off_over_on']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
