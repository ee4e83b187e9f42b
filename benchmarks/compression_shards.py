"""A file cut into shards, each coded by a process of its own on one thread, against one process on all of them.

    python benchmarks/compression_shards.py long-runs/wikitext-2-byte-h64-1layer vim-usr-01-05.txt --fast \\
        --shards 2 --repeats 5 --out benchmarks/results/compression_shards_fast_zen4_model17.json

``moglm compress`` codes every block of a file in one process, with one context mixer and one match model whose
statistics every block shares, on ``--threads`` torch threads. The other way to spend S cores is S independent
files: the file cut into S shards at a character boundary, each coded by ``moglm compress``'s arithmetic on one
thread in a process of its own (forked, so the run is loaded once), each with its own mixer, match model and header.
This measures both ways on the same file, the repeats taking turns, with the same run, blocks and mixer settings
(``moglm compress``'s, ``--fast``'s with ``--fast``; no neural cache): the bytes (the shards' files together) and the
speed of both directions, each round trip checked. The shards' time includes forking their processes (a pool a
repeat), as a user's would. Writes JSON and prints a markdown table.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from moglm.bench import command_line, timed, write_report
from moglm.compression import compress, decompress
from moglm.compression.run import MATCH, coding_model, context_settings
from moglm.errors import MoglmError

_JOB: dict = {}  # the run and settings, set before the pool forks, so that each process has them without pickling


def cut(data: bytes, shards: int) -> list[bytes]:
    """``data`` in ``shards`` pieces of about equal length, each cut where a UTF-8 character starts (never inside
    one, so that a character-level run reads every piece as it reads the whole)."""
    ends, start = [], 0
    for s in range(1, shards):
        end = max(start, len(data) * s // shards)
        while end < len(data) and data[end] & 0xC0 == 0x80:  # a continuation byte: move to the next character
            end += 1
        ends.append(end)
        start = end
    edges = [0, *ends, len(data)]
    return [data[a:b] for a, b in zip(edges, edges[1:])]


def _compress(data: bytes, threads: int) -> bytes:
    job = _JOB
    return compress(data, job["model"], job["vocab"], factor=job["factor"], contexts=job["contexts"], match=MATCH,
                    block_size=job["block_size"], threads=threads, progress=False)[0]


def _decompress(blob: bytes) -> bytes:
    return decompress(blob, _JOB["model"], _JOB["vocab"], progress=False)


def _one_thread() -> None:
    torch.set_num_threads(1)


def measure(run: Path, data: bytes, shards: int, fast: bool = False, block_size: int = 512,
            repeats: int = 3) -> dict:
    """Both ways of coding ``data`` with ``run`` on ``shards`` cores, ``repeats`` round trips each, taking turns."""
    if shards < 2:
        raise MoglmError("--shards must be at least 2 (one shard is moglm compress itself)")
    if repeats < 1:
        raise MoglmError("--repeats must be at least 1")
    pieces = cut(data, shards)
    if not all(pieces):
        raise MoglmError(f"{len(data)} bytes cannot make {shards} shards that each start a character")
    model, vocab, factor = coding_model(run, "best", None)
    _JOB.update(model=model, vocab=vocab, factor=factor, contexts=context_settings(True, fast), block_size=block_size)
    context = multiprocessing.get_context("fork")
    seconds: dict[str, list[tuple[float, float]]] = {"one process": [], "shards": []}
    sizes: dict[str, int] = {}
    for _ in range(repeats):
        there, blob = timed(lambda: _compress(data, shards))
        again, back = timed(lambda: _decompress(blob))
        if back != data:
            raise MoglmError("one process: the round trip did not restore the file")
        seconds["one process"].append((there, again))
        sizes["one process"] = len(blob)
        with ProcessPoolExecutor(shards, mp_context=context, initializer=_one_thread) as pool:
            there, blobs = timed(lambda: list(pool.map(_compress, pieces, [1] * shards)))
            again, backs = timed(lambda: list(pool.map(_decompress, blobs)))
        if b"".join(backs) != data:
            raise MoglmError("shards: the round trip did not restore the file")
        seconds["shards"].append((there, again))
        sizes["shards"] = sum(len(b) for b in blobs)
    rows = []
    for way, runs in seconds.items():
        there, again = (statistics.median(r[i] for r in runs) for i in (0, 1))
        rows.append({"way": way, "processes": 1 if way == "one process" else shards,
                     "threads_each": shards if way == "one process" else 1, "bytes": sizes[way],
                     "kilobytes_per_second": len(data) / there / 1e3,
                     "decompress_kilobytes_per_second": len(data) / again / 1e3,
                     "seconds_runs": [r[0] for r in runs], "decompress_seconds_runs": [r[1] for r in runs]})
    one, split = rows
    return {"run": run.name, "bytes": len(data), "shards": shards, "shard_bytes": [len(p) for p in pieces],
            "fast": fast, "block_size": block_size, "repeats": repeats, "rows": rows,
            "size_ratio": split["bytes"] / one["bytes"],
            "speedup": split["kilobytes_per_second"] / one["kilobytes_per_second"],
            "decompress_speedup": split["decompress_kilobytes_per_second"] / one["decompress_kilobytes_per_second"]}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("file", type=Path)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--fast", action="store_true", help="code with moglm compress --fast's lighter mixer")
    parser.add_argument("--block-size", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    saved = torch.get_num_threads()
    try:
        report = measure(args.run, args.file.read_bytes(), args.shards, args.fast, args.block_size, args.repeats)
    except (OSError, MoglmError) as error:
        raise SystemExit(f"compression_shards: {error}") from None
    finally:
        torch.set_num_threads(saved)
    report = {"command": command_line(), "file": args.file.name, **report}
    write_report(report, args.out)
    print(f"`{args.file.name}` ({report['bytes']:,} bytes) with `{report['run']}`, {args.shards} cores\n")
    print("| way | bytes | compress KB/s | decompress KB/s |\n| --- | ---: | ---: | ---: |")
    for r in report["rows"]:
        label = (f"one process, {r['threads_each']} threads" if r["way"] == "one process"
                 else f"{r['processes']} shards, a process each on one thread")
        print(f"| {label} | {r['bytes']:,} | {r['kilobytes_per_second']:.2f} | "
              f"{r['decompress_kilobytes_per_second']:.2f} |")
    print(f"\nshards / one process: {report['size_ratio']:.4f}x the bytes, {report['speedup']:.2f}x compressing, "
          f"{report['decompress_speedup']:.2f}x decompressing")
    if args.out:
        print(f"written to {args.out}")
    return report


if __name__ == "__main__":
    main()
