"""Tokens/s of moglm's recurrent layers against torch.nn.LSTM (forward+backward and forward only), with
the GEMM peak and the memory of a T=500 window; writes benchmarks/results/throughput.json.

    python benchmarks/throughput.py                      # H = 256, 650, 1024; a few minutes on two cores
    python benchmarks/throughput.py --hidden-size 650 --repeats 3 --memory-bptt 0
"""

from __future__ import annotations

from moglm.bench.throughput import main

if __name__ == "__main__":
    main()
