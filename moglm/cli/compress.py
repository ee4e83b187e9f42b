"""``moglm compress RUN FILE`` and ``moglm decompress RUN FILE.moglm`` (mounted by :mod:`moglm.cli`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..atomic import check_free
from ..compression.run import (ADAPTING_BLOCKS, CACHE, COMPRESSION_DECAY, COMPRESSION_LR, CONTEXTS, FAST_CONTEXTS,
                               MATCH, SCRATCH_LR, SCRATCH_RULE, UPDATE_TOKENS)
from .common import Checkpoint, UpdateRule
from ..errors import MoglmError


#: ``--ensemble``'s help (measured in docs/guides/compression.md, "Two runs mixed")
ENSEMBLE_HELP = ("Also read the file with this run (repeatable; the same vocabulary) and mix its predictions with "
                 "RUN_DIR's, by weights learnt while coding; each run adapts when RUN_DIR does, with its own settings. "
                 "Two runs trained apart coded held-out English 1-1.7% smaller, at half the speed; decompress needs "
                 "the same runs, in the same order.")

#: ``--fast``'s help (measured in docs/guides/compression.md, "A lighter mixer: --fast")
FAST_HELP = ("Mix with a lighter context mixer (contexts of "
             f"{', '.join(map(str, FAST_CONTEXTS.orders))} tokens and the word so far, one set of weights): 1.2-1.8 "
             "times as fast static with a small model, about 3% larger; the header records it.")


def _read(path: Path) -> bytes:
    if not path.is_file():
        raise MoglmError(f"{path}: no such file")
    return path.read_bytes()


def _write(path: Path, data: bytes, force: bool) -> None:
    from ..atomic import atomic_write_bytes

    check_free(path, force)
    atomic_write_bytes(path, data)


def compress(
    run_dir: Path = typer.Argument(..., help="A character- or byte-level run made by `moglm train`."),
    file: Path = typer.Argument(..., help="Any file."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Where to write (default: FILE.moglm)."),
    dynamic: bool = typer.Option(False, help="Adapt the model while coding (dynamic evaluation; the settings "
                                 f"of the run's dyneval/full.json, else rms-rmsdecay at lr {COMPRESSION_LR:g} (less "
                                 "for fewer than 12 blocks) and "
                                 f"decay {COMPRESSION_DECAY:g}, searched for compressing held-out English, with "
                                 f"segments of about {UPDATE_TOKENS} tokens across the blocks; rolled back, its "
                                 "step halved, where it codes worse than the trained model)."),
    rule: Optional[UpdateRule] = typer.Option(None, help="Update rule of the adaptation (default: as --dynamic)."),
    adapt_learning_rate: Optional[float] = typer.Option(
        None, help="Learning rate of the adaptation (default: the rule's; implies --dynamic)."),
    from_scratch: Optional[int] = typer.Option(
        None, min=0, metavar="SEED", help="Code with the run's architecture and vocabulary but weights drawn "
        "afresh with this seed, learning the file while coding it (for files large enough to learn from; rule "
        f"{SCRATCH_RULE} at {SCRATCH_LR:g} unless given; implies --dynamic)."),
    cache: bool = typer.Option(True, help="Mix the neural cache into the predictions: each block's last "
                               f"{CACHE.size} positions predict the next token beside the model, with a weight "
                               "learnt from the block as it is coded."),
    contexts: bool = typer.Option(True, help="Then mix in the file's own statistics: which token followed each "
                                  f"context of {', '.join(map(str, CONTEXTS.orders))} tokens so far, in every block, "
                                  "with weights learnt while coding (context mixing)."),
    fast: bool = typer.Option(False, "--fast", help=FAST_HELP),
    match: bool = typer.Option(True, help="Then mix in the match model: what followed the last occurrence, in any "
                               f"block, of a block's last {MATCH.min_length} tokens, at a probability learnt "
                               "from how often such predictions came true."),
    ensemble: list[Path] = typer.Option([], "--ensemble", metavar="RUN", help=ENSEMBLE_HELP),
    block_size: Optional[int] = typer.Option(
        None, min=0, help="Bytes per block, about: the blocks are coded side by side as one batch of streams "
        f"(default 4096; adapting, at most {ADAPTING_BLOCKS} blocks of 4096 bytes or more; 0: the whole file as one "
        "block)."),
    threads: Optional[int] = typer.Option(None, min=1, help="Torch threads of the compression, and of its "
                                          "decompression: the header records them (default 1)."),
    checkpoint: Checkpoint = typer.Option("best", help="The best or the last checkpoint."),
    report: Optional[Path] = typer.Option(None, help="Also write the sizes, code lengths and speed as JSON."),
    force: bool = typer.Option(False, "--force", "-f", help="Replace an existing output file."),
    progress: bool = typer.Option(True, help="Show a progress bar."),
) -> None:
    """Compress a file losslessly with a trained run's predictions (range coding; thesis 2.1.2)."""
    from ..compression import container
    from ..compression.layout import Layout, coverage_warning
    from ..compression.run import (adapter_from_settings, check_ensemble, coding_model, context_settings,
                                   dynamic_settings, ensemble_member, scratch_settings)

    check_ensemble(ensemble, from_scratch)
    mixer = context_settings(contexts, fast)
    data = _read(file)
    target = container.output_path(file, output, compressing=True)
    check_free(target, force)
    if report is not None:
        check_free(report, True)  # a folder, or a path through a file, is refused before the work
    settings = None if from_scratch is None else scratch_settings(from_scratch, rule, adapt_learning_rate)
    model, vocab, factor = coding_model(run_dir, checkpoint, from_scratch)
    layout = Layout.of(vocab)  # a word-level run is refused before any statistics are collected
    warning = coverage_warning(layout, data, str(file))
    if warning:
        typer.echo(warning, err=True)
    adapter = None
    adapting = settings is not None or dynamic or rule is not None or adapt_learning_rate is not None
    size = block_size if block_size is not None else container.default_block_size(len(data), adapting)
    options = {"block_size": size} | ({} if threads is None else {"threads": threads})
    streams = container.streams(data, vocab, size) if adapting else 0
    if settings is None and adapting:
        settings = dynamic_settings(run_dir, rule, adapt_learning_rate, streams)
    if settings is not None:
        adapter = adapter_from_settings(run_dir, model, checkpoint, factor, settings)
    others = [ensemble_member(each, checkpoint, vocab, dynamic_settings(each, rule, adapt_learning_rate, streams)
                              if adapting else None) for each in ensemble]
    blob, result = container.compress(data, model, vocab, factor=factor, adapter=adapter, settings=settings,
                                      cache=CACHE if cache else None, match=MATCH if match else None,
                                      contexts=mixer, progress=progress, others=others,
                                      **options)
    _write(target, blob, force)
    typer.echo(f"{file} -> {target}: {result.summary()}")
    if report is not None:
        from ..provenance import write_result

        write_result(report, {"run": str(run_dir), "file": str(file), "dynamic": settings, **result.as_dict()})


def decompress(
    run_dir: Path = typer.Argument(..., help="The run that compressed the file."),
    file: Path = typer.Argument(..., help="A file made by `moglm compress`."),
    output: Optional[Path] = typer.Option(None, "--output", "-o",
                                          help="Where to write (default: FILE without .moglm)."),
    checkpoint: Checkpoint = typer.Option("best", help="The checkpoint that compressed it."),
    dynamic: Optional[bool] = typer.Option(
        None, help="Only checked: the header decides how the file decodes, and a file compressed otherwise is "
        "refused."),
    block_size: Optional[int] = typer.Option(None, min=0, help="Only checked, as --dynamic."),
    ensemble: list[Path] = typer.Option([], "--ensemble", metavar="RUN", help="The further runs the file was "
                                        "compressed with (moglm compress --ensemble), in the same order."),
    force: bool = typer.Option(False, "--force", "-f", help="Replace an existing output file."),
    progress: bool = typer.Option(True, help="Show a progress bar."),
) -> None:
    """Restore a file made by `moglm compress` (checked against its SHA-256 before it is written); the file's
    header says how it was coded (run, blocks, adaptation, threads)."""
    import time

    from ..compression import container
    from ..compression.run import adapter_from_settings, coding_model, ensemble_member

    blob = _read(file)
    target = container.output_path(file, output, compressing=False)
    check_free(target, force)
    header, _ = container.read_header(blob, str(file))  # a damaged file fails before the model loads
    container.check_settings(header, str(file), dynamic=dynamic, block_size=block_size, runs=1 + len(ensemble))
    model, vocab, _ = coding_model(run_dir, checkpoint, container.scratch_seed(header))
    start = time.perf_counter()
    data = container.decompress(
        blob, model, vocab, name=str(file), progress=progress,
        adapter_for=lambda header: adapter_from_settings(run_dir, model, checkpoint, float(header["factor"]),
                                                         header["adapt"]),
        ensemble_for=lambda records: [ensemble_member(each, checkpoint, vocab, record["adapt"], record["factor"])
                                      for each, record in zip(ensemble, records)])
    _write(target, data, force)
    seconds = time.perf_counter() - start
    typer.echo(f"{file} -> {target}: {len(data):,} bytes in {seconds:.1f}s, "
               f"{len(data) / 1e3 / max(seconds, 1e-9):.2f} KB/s")
