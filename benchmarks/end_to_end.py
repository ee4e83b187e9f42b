"""Training tokens/s of the CPU-budget PTB configs and the time of `moglm train` with no arguments, with the
Python fused recurrence (before) and the compiled one (after); writes benchmarks/results/end_to_end.json.

    python benchmarks/end_to_end.py                      # moglm bench end-to-end, into benchmarks/results/; ~15 minutes on two cores
    python benchmarks/end_to_end.py ptb-word-mogrifier-cpu --steps 30 --no-default-command
"""

from __future__ import annotations

from moglm.cli import main

if __name__ == "__main__":
    import sys

    sys.exit(main(["bench", "end-to-end", "--out", "benchmarks/results/end_to_end.json", *sys.argv[1:]]))
