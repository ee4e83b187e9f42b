"""``moglm bench compress RUN FILE``: compress a file with a trained run, decompress it, check it is the same,
and put the size beside the model's cross-entropy and beside gzip -9, bzip2 -9 and xz -9 of the same file
(Python's zlib, bz2 and lzma modules at those levels: the same formats and settings as the command-line
tools), with the speed of both directions in KB/s. One row per block size (0: the whole file as one stream,
as moglm compressed before blocks), so that the batch's gain is measured in one run on one machine.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import MoglmError


def _located(file: Path) -> Path:
    """``file``, or a corpus file named as the configs name them, looked up under ``$MOGLM_DATA``."""
    if not file.is_file():
        from ..data.corpus import resolve_path

        file = resolve_path(file)
        if not file.is_file():
            raise MoglmError(f"{file}: not a file")
    return file


def file_size(file: Path) -> int:
    """``file``'s bytes (a path, or one relative to ``$MOGLM_DATA``)."""
    return _located(file).stat().st_size


def file_streams(run_dir: Path, file: Path, block_size: int) -> int:
    """How many blocks ``moglm compress`` cuts ``file`` into with the run's vocabulary at ``block_size``."""
    from ..compression.container import streams
    from ..runs.language_model import LanguageModelRun

    return streams(_located(file).read_bytes(), LanguageModelRun(run_dir).load_vocab(), block_size)


def run_compression(run_dir: Path, file: Path, settings: dict | None, block_size: int, threads: int,
                    checkpoint: str = "best", progress: bool = True, cache: bool = True, match: bool = True,
                    contexts: bool = True, log: Callable[[str], None] = print, repeats: int = 1,
                    ensemble: Sequence[tuple[Path, dict | None]] = (), fast: bool = False) -> dict[str, Any]:
    """The report of compressing and decompressing ``file`` (a path, or one relative to ``$MOGLM_DATA``)
    with the run (``settings``: adapt while coding, as ``moglm compress --dynamic`` records them; None: static),
    ``block_size`` bytes per block, ``threads`` torch threads and ``moglm compress``'s neural cache, context
    mixer (``fast``: ``moglm compress --fast``'s) and match model (or none). ``repeats``: round trips, each
    checked; the speeds are their medians (on a shared machine one run's can be 20% off), and every run's seconds
    are kept. ``ensemble``: further runs mixed with the run (``moglm compress --ensemble``), each with its
    adaptation's settings (``None``: static)."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise MoglmError(f"repeats must be a whole number >= 1, not {repeats!r}")
    runs = [_round_trip(run_dir, file, settings, block_size, threads, checkpoint, progress, cache, match, contexts,
                        log, ensemble, fast) for _ in range(repeats)]
    if len({r["compressed_bytes"] for r in runs}) != 1:  # the same file coded twice must be the same bytes
        raise MoglmError("two runs of the same compression gave different sizes")
    result = dict(runs[0])
    for key in ("seconds", "cpu_seconds", "decompress_seconds", "decompress_cpu_seconds"):
        result[key] = statistics.median(r[key] for r in runs)
        result[f"{key}_runs"] = [r[key] for r in runs]
    size = result["original_bytes"]
    result["kilobytes_per_second"] = size / 1e3 / max(result["seconds"], 1e-9)
    result["decompress_kilobytes_per_second"] = size / 1e3 / max(result["decompress_seconds"], 1e-9)
    result["repeats"] = repeats
    return result


def _round_trip(run_dir: Path, file: Path, settings: dict | None, block_size: int, threads: int, checkpoint: str,
                progress: bool, cache: bool, match: bool, contexts: bool,
                log: Callable[[str], None], ensemble: Sequence[tuple[Path, dict | None]],
                fast: bool = False) -> dict[str, Any]:
    """One compression and decompression of ``file`` (:func:`run_compression`'s arguments)."""
    from ..compression import compress, decompress, read_header
    from ..compression.run import CACHE, MATCH, adapter_from_settings, coding_model, context_settings, ensemble_member
    from ..recurrence.compiled import info

    file = _located(file)
    data = file.read_bytes()
    model, vocab, factor = coding_model(run_dir, checkpoint, (settings or {}).get("from_scratch"))
    adapter = None
    if settings is not None:
        adapter = adapter_from_settings(run_dir, model, checkpoint, factor, settings)
    others = [ensemble_member(each, checkpoint, vocab, adapting) for each, adapting in ensemble]
    blob, report = compress(data, model, vocab, factor=factor, adapter=adapter, settings=settings,
                            cache=CACHE if cache else None, match=MATCH if match else None,
                            contexts=context_settings(contexts, fast), block_size=block_size, threads=threads,
                            progress=progress, others=others)
    log(f"compressed: {report.summary()}")
    start, cpu = time.perf_counter(), time.process_time()
    restored = decompress(blob, model, vocab, progress=progress,
                          adapter_for=lambda header: adapter_from_settings(run_dir, model, checkpoint, factor,
                                                                           header["adapt"]),
                          ensemble_for=lambda records: [
                              ensemble_member(each, checkpoint, vocab, record["adapt"], record["factor"])
                              for (each, _), record in zip(ensemble, records)])
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    if restored != data:  # decompress checks the SHA-256 itself; this is the benchmark's own check
        raise MoglmError("the round trip did not restore the file")
    baselines = {"gzip -9": len(gzip.compress(data, 9, mtime=0)), "bzip2 -9": len(bz2.compress(data, 9)),
                 "xz -9": len(lzma.compress(data, preset=9))}
    result = {"file": file.name, "run": run_dir.name, "ensemble": [each.name for each, _ in ensemble],
              "architecture": model.architecture,
              "parameters": sum(p.numel() for p in model.parameters()), "dynamic": settings,
              "block_size": block_size, "fast": fast,
              **report.as_dict(), "decompress_seconds": seconds,
              "decompress_cpu_seconds": cpu_seconds,
              "decompress_kilobytes_per_second": len(data) / 1e3 / max(seconds, 1e-9), "baselines": baselines,
              "against": {name: report.compressed_bytes / size - 1 for name, size in baselines.items()},
              "cpu": info().get("cpu"), "path": read_header(blob)[0]["path"]}
    log(f"decompressed and checked in {seconds:.1f}s; " + ", ".join(
        f"{name} {size:,} bytes ({100 * result['against'][name]:+.1f}%)" for name, size in baselines.items()))
    return result


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """One row per compressor: bytes, bits per byte, and for the model its blocks, cross-entropy and speed."""
    first = rows[0]
    threads = first["threads"]
    lines = [f"`{first['file']}` ({first['original_bytes']:,} bytes) with `{first['run']}` ({first['architecture']}, "
             f"{first['parameters']:,} parameters), {first['cpu']}, {threads} thread{'s' if threads > 1 else ''}", "",
             "| compressor | blocks (raw) | bytes | bits per byte | model cross-entropy (bits per token) | "
             "coded vs ideal | compress KB/s (wall, CPU) | decompress KB/s (wall, CPU) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, size in first["baselines"].items():
        lines.append(f"| {name} | | {size:,} | {8 * size / first['original_bytes']:.3f} | | | | |")
    for r in rows:
        label = (f"moglm compress --block-size {r['block_size']}" + _adaptation(r["dynamic"])
                 + ("" if r.get("cache") else " --no-cache") + ("" if r.get("contexts", True) else " --no-contexts")
                 + (" --fast" if r.get("fast") else "")
                 + ("" if r.get("match", True) else " --no-match")
                 + "".join(f" --ensemble {each}" for each in r.get("ensemble", [])))
        lines.append(f"| {label} | {r['blocks']} ({r['raw_blocks']}) | {r['compressed_bytes']:,} | "
                     f"{r['bits_per_byte']:.3f} | {r['model_bits_per_token']:.4f} | "
                     f"{100 * r['coding_overhead']:+.3f}% | "
                     f"{r['kilobytes_per_second']:.2f}, {_per_cpu(r, r['cpu_seconds'])} | "
                     f"{r['decompress_kilobytes_per_second']:.2f}, {_per_cpu(r, r['decompress_cpu_seconds'])} |")
    return "\n".join(lines)


def _adaptation(settings: dict | None) -> str:
    if settings is None:
        return ""
    hp = settings["hyperparameters"]
    if settings.get("from_scratch") is not None:
        return f" --from-scratch {settings['from_scratch']} ({hp['rule']}, lr {hp['lr']:g})"
    return f" --dynamic ({hp['rule']})"


def _per_cpu(row: dict[str, Any], cpu_seconds: float) -> str:
    """KB per CPU second of the process (all its threads): the rate other jobs on the machine do not change."""
    return f"{row['original_bytes'] / 1e3 / max(cpu_seconds, 1e-9):.2f}"
