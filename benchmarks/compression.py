"""Lossless compression of the PTB char test split with the CPU-scale Mogrifier of ``moglm experiment run
transformer-dyneval --scale cpu``, static and with dynamic evaluation, against gzip -9, bzip2 -9 and xz -9;
writes benchmarks/results/compression.json.

    python benchmarks/compression.py experiments/cpu/runs/ptb-char-mogrifier-s1 ptb-char/ptb.char.test.txt --dynamic

(the file is looked up under $MOGLM_DATA as the configs' corpora are; about 10 minutes on one core)
"""

from __future__ import annotations

from moglm.cli import main

if __name__ == "__main__":
    import sys

    sys.exit(main(["bench", "compress", "--out", "benchmarks/results/compression.json", *sys.argv[1:]]))
