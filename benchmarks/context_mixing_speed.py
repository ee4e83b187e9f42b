"""The context mixer's step, numpy's arithmetic against the compiled kernel's, on a text cut into blocks.

    python benchmarks/context_mixing_speed.py vim-usr-01-05.txt --blocks 198 --threads 2 \\
        --out benchmarks/results/context_mixing_speed.json

Both mixers (``moglm compress``'s default settings, byte level) read the same text, cut into ``--blocks`` blocks
read side by side, with the same model distributions (a fixed random draw per step, so that no model's time is
in it), step by step: each step is one :meth:`mix` and one :meth:`append` of each, timed apart and interleaved, so
the ratio of the two is measured in one run on the same machine state. Per mixer: the milliseconds of a step (the
median over the steps) and the bytes a second that this alone allows; and the largest difference between the two
mixtures at any step (the numpy mixer is the compiled one's reference twin; they round differently). Writes JSON
and prints a markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from moglm.bench import command_line, write_report
from moglm.compression.compiled_mixing import context_mixer, kernel_available
from moglm.compression.run import CONTEXTS
from moglm.errors import MoglmError


def measure(data: bytes, blocks: int, threads: int, steps: int | None = None, seed: int = 0) -> dict:
    """Time both kernels' steps on ``data`` in ``blocks`` blocks (``steps``: at most this many steps)."""
    if not kernel_available():
        raise MoglmError("the compiled library cannot be built here, so there is nothing to compare")
    torch.set_num_threads(threads)
    length = len(data) // blocks
    if length < 1:
        raise MoglmError(f"{len(data)} bytes cannot fill {blocks} blocks")
    steps = length if steps is None else min(steps, length)
    tokens = np.frombuffer(data[: length * blocks], np.uint8).reshape(blocks, length).T.astype(np.int64)  # [L, B]
    chars = {i: chr(i) for i in range(256)}
    mixers = {kernel: context_mixer(replace(CONTEXTS, kernel=kernel), blocks, 256, chars, tokens=tokens.size)
              for kernel in ("numpy", "compiled")}
    seconds: dict[str, list[float]] = {kernel: [] for kernel in mixers}
    rng, worst = np.random.default_rng(seed), 0.0
    for t in range(steps):
        p = rng.random((blocks, 256)) ** 4  # [B, V]: a peaked draw, normalised by the mixers
        mixed = {}
        for kernel, mixer in mixers.items():
            start = time.perf_counter()
            mixed[kernel] = mixer.mix(p)
            mixer.append(tokens[t])
            seconds[kernel].append(time.perf_counter() - start)
        worst = max(worst, float(np.abs(mixed["numpy"] - mixed["compiled"]).max()))
    rows = []
    for kernel, times in seconds.items():
        step = statistics.median(times)
        rows.append({"kernel": kernel, "step_ms": 1e3 * step, "kilobytes_per_second": blocks / step / 1e3})
    return {"blocks": blocks, "steps": steps, "threads": threads, "rows": rows,
            "speedup": rows[0]["step_ms"] / rows[1]["step_ms"], "largest_difference": worst}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--blocks", type=int, default=198)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=None, help="at most this many steps (default: the whole text)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        report = measure(args.file.read_bytes(), args.blocks, args.threads, args.steps)
    except (OSError, MoglmError) as error:
        raise SystemExit(f"context_mixing_speed: {error}") from None
    report = {"command": command_line(), "file": args.file.name, **report}
    write_report(report, args.out)
    print(f"`{args.file.name}`, {args.blocks} blocks, {report['steps']} steps, {args.threads} threads\n")
    print("| kernel | ms a step | KB/s (the mixer alone) |\n| --- | ---: | ---: |")
    for r in report["rows"]:
        print(f"| {r['kernel']} | {r['step_ms']:.3f} | {r['kilobytes_per_second']:.1f} |")
    print(f"\ncompiled / numpy: {report['speedup']:.2f}x faster; largest difference between the mixtures "
          f"{report['largest_difference']:.2e}")
    if args.out:
        print(f"written to {args.out}")
    return report


if __name__ == "__main__":
    main()
