"""LSTM vs Mogrifier on PTB word at a CPU budget: equal parameter count, equal training tokens.

    python benchmarks/ptb_cpu_budget.py            # ~1-2 hours on two CPU cores; resumes if interrupted

Trains the shipped configs ``ptb-word-lstm-cpu`` and ``ptb-word-mogrifier-cpu`` side by side (one CPU
thread each), evaluates each the paper's way (best checkpoint, softmax temperature searched on
validation, one continuous stream), and writes ``benchmarks/results/ptb_cpu_budget.json`` plus a
markdown table with the paper's 24M numbers beside ours. Needs ../shared/data/ptb (or $MOGLM_DATA).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from moglm.bench.budget_comparison import compare, markdown_table

HERE = Path(__file__).resolve().parent


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=["ptb-word-lstm-cpu", "ptb-word-mogrifier-cpu"])
    parser.add_argument("--runs", default=str(HERE / "runs"), help="where the run directories go")
    parser.add_argument("--out", default=str(HERE / "results" / "ptb_cpu_budget.json"))
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="config override for all runs")
    parser.add_argument("--sequential", action="store_true", help="one run after another, all threads each")
    args = parser.parse_args(argv)
    report = compare(args.configs, args.runs, args.out, args.overrides, parallel=not args.sequential)
    print(markdown_table(report))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
