"""LSTM vs Mogrifier on PTB word at a CPU budget: equal parameter count, equal training tokens.

    python benchmarks/ptb_cpu_budget.py            # ~1-2 hours on two CPU cores; resumes if interrupted

The ``budget`` experiment at ``cpu`` scale (``moglm experiment run budget --scale cpu --workers 2``):
the shipped configs ``ptb-word-lstm-cpu`` and ``ptb-word-mogrifier-cpu`` side by side (one CPU thread
each), each evaluated the paper's way (best checkpoint, softmax temperature searched on validation, one
continuous stream), then ``moglm report`` writes the table with the paper's 24M numbers beside ours.
Needs the PTB corpus (``$MOGLM_DATA/ptb``).
"""

from __future__ import annotations

import sys

from moglm.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "budget", "--scale", "cpu", "--workers", "2", *sys.argv[1:]]))
