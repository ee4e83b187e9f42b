"""The neural cache's settings searched for compression on held-out text: the flatness theta and the weight
lambda of ``moglm compress``'s cache (Krause thesis 2.2.1; Grave et al. 2017), for the run's weights read
statically and adapting while coding (``--dynamic``), at each cache size.

    cat /usr/share/vim/vim90/doc/usr_0[6-8].txt > vim-usr-06-08.txt    # tuning text; 01-05 is the test text
    python benchmarks/compression_cache_search.py long-runs/wikitext-2-byte-3000 vim-usr-06-08.txt \\
        --out benchmarks/results/compression_cache_search.json          # a few minutes on one core

The file is cut into blocks as ``moglm compress`` cuts it and read as that many streams (each block its own
cache); one static pass and one adapting pass keep their features, and one pass of the cache over each scores
the whole grid (:func:`moglm.evaluation.neural_cache.search_cache`), as ``moglm dyneval --cache`` tunes it.
The score is the mixture's cross-entropy in bits per byte (the coded size less the header, within the coder's
0.1-0.3%); ``moglm bench compress`` measures the settings chosen. Writes JSON and prints a markdown table.
"""

from __future__ import annotations

import argparse
import lzma
import math
from pathlib import Path

import torch

from moglm.bench import command_line, write_report
from moglm.compression.container import BLOCK_SIZE, block_tokens, streams
from moglm.compression.layout import Layout
from moglm.compression.run import adapter_from_settings, dynamic_settings
from moglm.evaluation.neural_cache import search_cache
from moglm.runs.language_model import load_run

SIZES = [500, 1000, 2000]
THETAS = [0.1, 0.2, 0.3, 0.5, 1.0]
LAMS = [0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]


def _blocks(data: bytes, vocab, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets ``[L, B]``: block b's tokens in column b, read from the layout's start token (each
    block cut to the shortest's length: at most one token fewer)."""
    layout = Layout.of(vocab)
    tokens = layout.split(data)[0]
    counts = block_tokens(len(tokens), streams(data, vocab, block_size))
    length, columns, first = min(counts), [], 0
    for n in counts:
        columns.append(tokens[first : first + length])
        first += n
    targets = torch.tensor(columns, dtype=torch.long).t().contiguous()  # [L, B]
    inputs = torch.cat([torch.full((1, targets.shape[1]), layout.start), targets[:-1]])  # [L, B]
    return inputs, targets


def passes(run_dir: Path, data: bytes, block_size: int) -> dict[str, tuple]:
    """``{"static" | "dynamic": (nll [L, B], features [L, B, H], targets [L, B], segment length or None)}``."""
    run = load_run(run_dir, "best", "cpu")
    inputs, targets = _blocks(data, run.vocab, block_size)
    with torch.no_grad():
        nll, features, _ = run.model.nll_features(inputs, targets, None, run.temperature)  # [L, B], [L, B, H]
    out = {"static": (nll, features, targets, None)}
    settings = dynamic_settings(run_dir, streams=targets.shape[1])
    adapter = adapter_from_settings(run_dir, run.model, "best", run.temperature, settings)
    adapter.keep_features = True
    n, losses, kept, state = settings["hyperparameters"]["segment_length"], [], [], None
    for start in range(0, len(inputs), n):
        loss, state = adapter.step(inputs[start : start + n], targets[start : start + n], state)
        losses.append(loss)
        kept.append(adapter.features)
    out["dynamic"] = (torch.cat(losses), torch.cat(kept), targets, n)
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("file", type=Path)
    parser.add_argument("--block-size", type=int, default=BLOCK_SIZE, help="bytes per block (moglm compress's)")
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES, help="cache sizes (positions per block)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="compression_cache_search.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = args.file.read_bytes()
    xz = len(lzma.compress(data, preset=9))
    rows = []
    for name, (nll, features, targets, n) in passes(args.run, data, args.block_size).items():
        for size in args.sizes:
            found = search_cache(nll, features, targets, size=size, thetas=THETAS, lams=LAMS)
            rows.append({"pass": name, "segment_length": n, "size": size, "theta": found.best.theta,
                         "lam": found.best.lam, "blocks": targets.shape[1],
                         "bits_per_byte_without": found.base_xent / math.log(2) * len(targets.flatten()) / len(data),
                         "bits_per_byte": found.xent / math.log(2) * len(targets.flatten()) / len(data),
                         "trials": found.trials})
    report = {"command": command_line(), "file": args.file.name, "bytes": len(data), "run": args.run.name,
              "block_size": args.block_size, "xz -9": xz, "xz -9 bits_per_byte": 8 * xz / len(data), "rows": rows}
    write_report(report, args.out)
    print(f"`{args.file.name}` ({len(data):,} bytes, {rows[0]['blocks']} blocks), xz -9 {xz:,} bytes "
          f"({8 * xz / len(data):.3f} bits per byte)\n")
    print("| pass | cache size | theta | lambda | bits per byte without | with the cache | change |\n"
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['pass']} | {r['size']:,} | {r['theta']:g} | {r['lam']:g} | {r['bits_per_byte_without']:.3f} | "
              f"{r['bits_per_byte']:.3f} | {100 * (r['bits_per_byte'] / r['bits_per_byte_without'] - 1):+.1f}% |")
    print(f"written to {args.out}")
    return report


if __name__ == "__main__":
    main()
