"""Synthetic tasks on one CPU thread: WCPA on bounded Dyck-(2, m) and the reverse copy task.

    OMP_NUM_THREADS=1 python benchmarks/synthetic_tasks.py        # everything; about 1.5 hours on one thread
    OMP_NUM_THREADS=1 python benchmarks/synthetic_tasks.py --part dyck --part reverse-copy-search
    OMP_NUM_THREADS=1 python benchmarks/synthetic_tasks.py --part reverse-copy --lengths 40 --steps 8000

Every run has its own run directory under ``benchmarks/runs/synthetic/`` and a finished run (one with
``results.json``) is read back instead of trained again, so an interrupted benchmark resumes. Writes
``benchmarks/results/synthetic_tasks.json`` and prints markdown tables.

* Dyck-(2, m), m in {4, 6, 8}: the report's Dyck-RNN (closing-bracket objective; frozen 1-d embedding
  with H = m, and the learned 2-d one with H = 2m), the natural-language cells as language models at one
  small parameter budget (128 sequences per step; 1000 steps for the Dyck-RNN, 500 for the others, whose
  steps cost 2-6 times more; the Dyck-RNN's validation WCPA at step 500 is in the table too); and the
  Dyck-RNN with a random instead of a zero gate start (m = 8, three seeds).
* Reverse copy, vocabulary 64, LSTM vs Mogrifier at one parameter budget (``largest_hidden_size``):
  short runs (500 steps) at lengths 10, 20, 40 (cross-entropy per length), then both models for 8000
  steps at lengths 20 and 40 (the same steps and sequences for both).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from moglm.tasks.dyck import DyckTask
from moglm.tasks.dyck_training import DyckTraining, run_dyck
from moglm.tasks.reverse_copy import ReverseCopyConfig, run_reverse_copy
from moglm.runs import load_group
from moglm.runs import RunDirectory

HERE = Path(__file__).resolve().parent
DEPTHS = (4, 6, 8)
NATURAL = {  # architecture -> cell options (the Mogrifier's rank must fit its small sizes)
    "lstm": {}, "mogrifier": {"rounds": 5, "rank": 4}, "multiplicative_lstm": {}, "gru": {}, "mmlstm": {},
}
DYCK = dict(batch_size=128, steps=1000, eval_every=250)  # the Dyck-RNN: 1000 steps of 128 sequences
NATURAL_STEPS = 500  # the natural-language cells: 500 steps of 128 (their time per step is 2-6x the Dyck-RNN's)
DYCK_RNN_LR, NATURAL_LR, NATURAL_PARAMS = 0.03, 0.01, 2500
REVERSE = dict(vocab_size=64, num_params=100_000, batch_size=64, learning_rate=0.01, valid_examples=1000,
               test_examples=1000)
REVERSE_CELLS = {"lstm": {}, "mogrifier": {"rounds": 5, "rank": 16}}
SEARCH_LENGTHS, SEARCH_STEPS = (10, 20, 40), 500


def _quiet(_: str) -> None:
    pass


def _timed(name: str, runs: Path, train) -> dict:
    """Run ``train(run_dir)`` unless the run finished before; adds the wall time of this call's training."""
    run_dir = runs / name
    if (run_dir / "results.json").is_file():
        return json.loads((run_dir / "results.json").read_text())
    start = time.perf_counter()
    results = train(run_dir)
    results["wall_seconds"] = time.perf_counter() - start
    (run_dir / "results.json").write_text(json.dumps(results, indent=1))
    print(f"{name}: {results['wall_seconds'] / 60:.1f} min", flush=True)
    return results


def _curve(run_dir: Path) -> list[list]:
    """(step, valid WCPA) at every evaluation, from metrics.jsonl."""
    return [[r["step"], r["wcpa"]] for r in RunDirectory(run_dir).read_metrics()
            if r.get("kind") in ("valid", "valid_wcpa") and "wcpa" in r]


def dyck_runs(runs: Path, quick: bool) -> list[dict]:
    out = []
    budget = dict(DYCK, steps=40, eval_every=20) if quick else DYCK
    for m in DEPTHS:
        task = DyckTask(max_depth=m, train_sequences=200 if quick else 2000)
        models = [("dyck_rnn", "frozen 1-d", DyckTraining(learning_rate=DYCK_RNN_LR, **budget)),
                  ("dyck_rnn", "learned 2-d", DyckTraining(learned_embedding=True, learning_rate=DYCK_RNN_LR, **budget))]
        natural = dict(budget, steps=budget["steps"] if quick else NATURAL_STEPS)
        models += [(a, "", DyckTraining(a, num_params=NATURAL_PARAMS, learning_rate=NATURAL_LR, **natural))
                   for a in NATURAL]
        for arch, variant, training in models:
            name = f"dyck-m{m}-{arch}{'-learned' if 'learned' in variant else ''}"
            cell = [f"model.cell={json.dumps(NATURAL[arch])}"] if NATURAL.get(arch) else []
            r = _timed(name, runs, lambda d: run_dyck(task, training, d, cell, progress=False, log=_quiet))
            out.append({"m": m, "architecture": arch, "variant": variant, "objective": training.objective,
                        "num_params": r["num_params"], "hidden_size": r["hidden_size"],
                        "test_wcpa": r["wcpa"]["test"]["wcpa"], "test_accuracy": r["wcpa"]["test"]["accuracy"],
                        "steps": training.steps, "valid_wcpa": r["wcpa"]["valid"]["wcpa"],
                        "valid_wcpa_curve": _curve(runs / name),
                        "test_buckets": r["wcpa"]["test"]["buckets"], "wall_seconds": r.get("wall_seconds")})
    return out


def random_gate_runs(runs: Path, quick: bool) -> list[dict]:
    out = []
    for seed in (1, 2, 3):
        task = DyckTask(max_depth=8, train_sequences=200 if quick else 2000)
        training = DyckTraining(zero_gate=False, learning_rate=DYCK_RNN_LR, seed=seed,
                                **dict(DYCK, steps=40 if quick else 500, eval_every=20 if quick else 250))
        name = f"dyck-m8-dyck_rnn-random-gate-seed{seed}"
        r = _timed(name, runs, lambda d: run_dyck(task, training, d, progress=False, log=_quiet))
        out.append({"seed": seed, "steps": training.steps, "test_wcpa": r["wcpa"]["test"]["wcpa"],
                    "test_accuracy": r["wcpa"]["test"]["accuracy"], "gate_weight": _gate_weight(runs / name)})
    return out


def _gate_weight(run_dir: Path) -> float:
    """The trained push/pop gate weight of a Dyck-RNN run (its best checkpoint)."""
    weights = load_group(RunDirectory(run_dir).checkpoints.pointer("best")["path"], "model")
    return float(weights["rnn.weight_gate_l0"].item())


def reverse_copy_run(runs: Path, arch: str, length: int, steps: int, quick: bool) -> dict:
    cfg = ReverseCopyConfig(length=length, architecture=arch, cell=REVERSE_CELLS[arch], steps=steps,
                            eval_every=max(steps // 5, 1), **dict(REVERSE, valid_examples=100, test_examples=100)
                            if quick else REVERSE)
    r = _timed(f"reverse-copy-{arch}-L{length}-{steps}", runs,
               lambda d: run_reverse_copy(cfg, d, progress=False, log=_quiet))
    test = r["splits"]["test"]
    return {"architecture": arch, "length": length, "steps": steps, "num_params": r["num_params"],
            "hidden_size": r["hidden_size"], "test_xent": test["xent"], "test_sequence_accuracy":
            test["sequence_accuracy"], "test_token_accuracy": test["token_accuracy"],
            "train_seconds": r["train_seconds"]}


def _all_runs(runs: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(runs.glob("*/results.json"))]


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def markdown(report: dict) -> str:
    lines = []
    if report.get("dyck"):
        lines += ["| m | model | params | hidden | steps | valid WCPA % at step 500 | valid WCPA % | test WCPA % "
                  "| test accuracy % | minutes |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in report["dyck"]:
            model = f"{r['architecture']} {r['variant']}".strip() + f" ({r['objective']})"
            minutes = "-" if r["wall_seconds"] is None else f"{r['wall_seconds'] / 60:.1f}"
            at_500 = next((w for step, w in r["valid_wcpa_curve"] if step == 500), None)
            lines.append(f"| {r['m']} | {model} | {r['num_params']:,} | {r['hidden_size']} | {r['steps']} | "
                         f"{_pct(at_500)} | {_pct(r['valid_wcpa'])} | {_pct(r['test_wcpa'])} | "
                         f"{_pct(r['test_accuracy'])} | {minutes} |")
    if report.get("random_gate"):
        lines += ["", "| Dyck-RNN m = 8, random gate start | steps | gate weight | test WCPA % | test accuracy % |",
                  "| --- | --- | --- | --- | --- |"]
        for r in report["random_gate"]:
            lines.append(f"| seed {r['seed']} | {r['steps']} | {r['gate_weight']:+.2f} | {_pct(r['test_wcpa'])} | "
                         f"{_pct(r['test_accuracy'])} |")
    for key, title in (("reverse_copy_search", "search"), ("reverse_copy", "final")):
        if report.get(key):
            lines += ["", f"| reverse copy ({title}) | length | steps | params | hidden | test xent (nats) | "
                          "exact sequences % | tokens % | train minutes |",
                      "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
            for r in report[key]:
                lines.append(f"| {r['architecture']} | {r['length']} | {r['steps']} | {r['num_params']:,} | "
                             f"{r['hidden_size']} | {r['test_xent']:.3f} | {_pct(r['test_sequence_accuracy'])} | "
                             f"{_pct(r['test_token_accuracy'])} | {r['train_seconds'] / 60:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", action="append", choices=["dyck", "random-gate", "reverse-copy-search",
                                                            "reverse-copy"], help="parts to run (default: all)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[20, 40],
                        help="reverse copy: the lengths of the longer runs")
    parser.add_argument("--steps", type=int, default=8000, help="reverse copy: the steps of the longer runs")
    parser.add_argument("--runs", default=str(HERE / "runs" / "synthetic"))
    parser.add_argument("--out", default=str(HERE / "results" / "synthetic_tasks.json"))
    parser.add_argument("--quick", action="store_true", help="tiny settings, to check the script")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    parts = args.part or ["dyck", "random-gate", "reverse-copy-search", "reverse-copy"]
    runs = Path(args.runs + ("-quick" if args.quick else ""))
    out = runs / "synthetic_tasks.json" if args.quick else Path(args.out)
    report = json.loads(out.read_text()) if out.is_file() and not args.quick else {}
    report["command"] = "OMP_NUM_THREADS=1 python " + " ".join(["benchmarks/synthetic_tasks.py", *(argv or sys.argv[1:])])
    started = time.perf_counter()
    if "dyck" in parts:
        report["dyck"] = dyck_runs(runs, args.quick)
    if "random-gate" in parts:
        report["random_gate"] = random_gate_runs(runs, args.quick)
    if "reverse-copy-search" in parts:
        lengths = (4, 6) if args.quick else SEARCH_LENGTHS
        report["reverse_copy_search"] = [reverse_copy_run(runs, a, n, 20 if args.quick else SEARCH_STEPS, args.quick)
                                         for n in lengths for a in REVERSE_CELLS]
    if "reverse-copy" in parts:
        steps = 40 if args.quick else args.steps
        report["reverse_copy"] = [reverse_copy_run(runs, a, n, steps, args.quick) for n in args.lengths
                                  for a in REVERSE_CELLS]
    report["settings"] = {"dyck": DYCK, "natural_steps": NATURAL_STEPS, "dyck_rnn_lr": DYCK_RNN_LR, "natural_lr": NATURAL_LR,
                          "natural_params": NATURAL_PARAMS, "natural_cells": NATURAL, "reverse_copy": REVERSE,
                          "reverse_copy_cells": REVERSE_CELLS, "search_steps": SEARCH_STEPS, "threads": 1}
    report["wall_minutes_this_call"] = (time.perf_counter() - started) / 60
    report["wall_minutes_all_runs"] = sum(r.get("wall_seconds") or 0 for r in _all_runs(runs)) / 60
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(markdown(report))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
