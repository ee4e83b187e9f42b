"""``moglm bench ...``: the benchmarks, as commands.

``moglm bench throughput`` (the recurrences' speed table against nn.LSTM), ``end-to-end`` (training tokens/s
and ``moglm train``'s time, Python fused against compiled), ``gemm-routes``, ``budget`` (the ``budget``
experiment: LSTM vs Mogrifier at equal parameters and tokens), ``hf-dyneval`` (dynamic evaluation of a
GPT-2-shaped Hugging Face model against its static pass), ``lm-eval`` (lm-evaluation-harness's wikitext perplexity,
static and dynamic), ``compress`` and ``export`` (a run exported to transformers against the run: logits and
greedy generation). Each writes JSON (by default under
the user's cache, so that running one in a checkout never overwrites committed results; ``--out
benchmarks/results/<name>.json`` updates them) and prints the markdown table the docs show.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .common import DEVICE_HELP, ThroughputModel, UpdateRule, deprecated, new_app, renamed, values
from ..errors import MoglmError
from ..bench import default_out

OUT_HELP = ("Where the JSON report goes (default: under the user's cache, never the working tree; the repository's "
            "committed results are regenerated with --out benchmarks/results/<name>.json).")


app = new_app("Benchmarks: recurrent-layer throughput against torch.nn.LSTM; equal-budget comparisons.")

@app.command()
def throughput(
    hidden_size: list[int] = typer.Option([], help="Hidden sizes, input size = hidden size (default: 256 650 "
                                                    "1024 on CPU; 650 1500 on CUDA)."),
    batch_size: list[int] = typer.Option([], help="Batch sizes B (default: 64 on CPU; 64 128 on CUDA)."),
    bptt: int = typer.Option(70, help="Window T."),
    repeats: int = typer.Option(5, help="Interleaved repeats per model; the median is reported."),
    memory_bptt: Optional[int] = typer.Option(None, help="Window of the memory measurement (0: skip it; "
                                                        "default: 500 on CPU, --bptt on CUDA)."),
    model: list[ThroughputModel] = typer.Option([], help="Only these models (default: all on CPU; cuDNN, "
                                                          "moglm's LSTM, Mogrifier and mLSTM, each also as CUDA "
                                                          "graphs, on CUDA)."),
    device: str = typer.Option("cpu", help=DEVICE_HELP),
    precision: list[str] = typer.Option([], help="Precisions of the products, one report each: fp32, tf32 "
                                                 "(CUDA) or bf16 (autocast) (default: fp32 on CPU; fp32 tf32 "
                                                 "bf16 on CUDA)."),
    epoch_steps: int = typer.Option(30, help="CUDA: optimizer steps of the paper's PTB Mogrifier (24M) timed "
                                             "for one epoch's seconds (0: skip)."),
    threads: Optional[int] = typer.Option(None, min=1, help="CPU threads for torch (default: torch's)."),
    out: Optional[Path] = typer.Option(None, help=OUT_HELP),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Print the recurrence's details (routes, probes) "
                                 "before the table, not just their summary."),
    hidden: list[int] = deprecated("--hidden", default=[]),
    batch: Optional[int] = deprecated("--batch"),
) -> None:
    """Tokens/s of nn.LSTM and moglm's LSTM, Mogrifier and multiplicative LSTM; ratios, % of GEMM peak, memory."""
    out = out or default_out("throughput.json")  # read at call time: $MOGLM_BENCH_DIR may change
    import torch

    from ..device import resolve_device
    from ..bench.end_to_end import epoch_seconds
    from ..bench.throughput import CUDA_MODELS, GRAPHED, MODELS, PRECISIONS, markdown_table, run_throughput

    cuda = resolve_device(device).type == "cuda"  # one line if CUDA was asked for and is absent
    hidden_size = renamed(hidden_size, hidden, "--hidden", "--hidden-size") or ([650, 1500] if cuda else
                                                                                  [256, 650, 1024])
    batch_size = renamed(batch_size, [batch] if batch else [], "--batch", "--batch-size") or (
        [64, 128] if cuda else [64])
    memory_bptt = (bptt if cuda else 500) if memory_bptt is None else memory_bptt
    model = values(model)
    if min(hidden_size + batch_size) < 1 or bptt < 1 or repeats < 1 or memory_bptt < 0 or epoch_steps < 0:
        raise MoglmError("--hidden-size, --batch-size, --bptt and --repeats must be positive, --memory-bptt and "
                         "--epoch-steps >= 0")
    if not cuda and (graphed := [m for m in model if m in GRAPHED]):
        raise MoglmError(f"--model {graphed[0]!r} runs on CUDA only (use --device cuda)")
    precision = precision or (list(PRECISIONS) if cuda else ["fp32"])
    if unknown := [p for p in precision if p not in PRECISIONS]:
        raise MoglmError(f"unknown --precision {unknown[0]!r} (use {', '.join(PRECISIONS)})")
    if not cuda and "tf32" in precision:
        raise MoglmError("--precision tf32 is a CUDA precision (use fp32 or bf16 on CPU)")
    if threads is not None:
        torch.set_num_threads(max(1, threads))
    for p in precision:
        for b in batch_size:
            suffix = (f"-{p}" if len(precision) > 1 else "") + (f"-b{b}" if len(batch_size) > 1 else "")
            path = out.with_name(f"{out.stem}{suffix}{out.suffix}")
            report = run_throughput(tuple(hidden_size), b, bptt, repeats, memory_bptt,
                                    tuple(model) or (CUDA_MODELS if cuda else MODELS), device, path,
                                    log=typer.echo, precision_name=p, verbose=verbose)
            typer.echo(markdown_table(report))
            typer.echo(f"written to {path}")
    if cuda and epoch_steps:
        path = out.with_name(f"{out.stem}-epoch{out.suffix}")
        epoch_seconds("ptb-word-mogrifier-paper", device, epoch_steps, path, log=typer.echo)
        typer.echo(f"written to {path}")

@app.command()
def epoch(
    config: str = typer.Argument("ptb-word-mogrifier-paper", help="A shipped config name or file."),
    device: str = typer.Option("cpu", help=DEVICE_HELP),
    steps: int = typer.Option(30, help="Optimizer steps timed (the first 10 are warm-up)."),
    cuda_graphs: Optional[bool] = typer.Option(
        None, "--cuda-graphs/--no-cuda-graphs", help="Train with train.cuda_graphs true or false (default: the "
        "config's, auto: graphs on CUDA)."),
    out: Optional[Path] = typer.Option(None, help=OUT_HELP),
) -> None:
    """Training tokens/s of a config on a device, and the time one epoch takes at that rate."""
    out = out or default_out("epoch.json")  # read at call time: $MOGLM_BENCH_DIR may change
    from ..device import resolve_device
    from ..bench.end_to_end import epoch_seconds

    if resolve_device(device).type != "cuda" and cuda_graphs:  # resolving also refuses an unknown device
        raise MoglmError("--cuda-graphs needs --device cuda")
    if steps < 20:
        raise MoglmError("--steps must be at least 20 (the trainer reports its rate every 10 steps)")
    epoch_seconds(config, device, steps, out, log=typer.echo, cuda_graphs=cuda_graphs)
    typer.echo(f"written to {out}")

@app.command("gemm-routes")
def gemm_routes(
    hidden_size: list[int] = typer.Option([256, 650, 1024], help="Hidden sizes (input size = hidden size)."),
    batch_size: int = typer.Option(64, help="Batch size B, split over the threads."),
    out: Optional[Path] = typer.Option(None, help=OUT_HELP),
    hidden: list[int] = deprecated("--hidden", default=[]),
    batch: Optional[int] = deprecated("--batch"),
) -> None:
    """GFLOP/s of the compiled recurrence's GEMM routes at the products a window runs per step."""
    out = out or default_out("gemm_routes.json")  # read at call time: $MOGLM_BENCH_DIR may change
    from ..bench.gemm_routes import markdown_table, run_gemm_routes

    hidden_size = renamed(hidden_size, hidden, "--hidden", "--hidden-size")
    batch_size = renamed(batch_size, batch, "--batch", "--batch-size")
    if min(hidden_size, default=1) < 1 or batch_size < 1:
        raise MoglmError("--hidden-size and --batch-size must be positive")
    try:
        report = run_gemm_routes(tuple(hidden_size), batch_size, out_path=out, log=typer.echo)
    except RuntimeError as error:
        raise MoglmError(str(error)) from None
    typer.echo(markdown_table(report))
    typer.echo(f"written to {out}")

@app.command("end-to-end")
def end_to_end(
    configs: list[str] = typer.Argument(None, help="Shipped config names or files (default: "
                                                     "ptb-word-lstm-cpu ptb-word-mogrifier-cpu)."),
    steps: int = typer.Option(60, help="Optimizer steps per config and backend."),
    default_command: bool = typer.Option(True, help="Also time `moglm train` with no arguments."),
    out: Optional[Path] = typer.Option(None, help=OUT_HELP),
) -> None:
    """Training tokens/s of configs and the time of `moglm train`, Python fused (before) vs compiled (after)."""
    out = out or default_out("end_to_end.json")  # read at call time: $MOGLM_BENCH_DIR may change
    from ..bench.end_to_end import markdown_table, run_end_to_end

    if steps < 2:
        raise MoglmError("--steps must be at least 2")
    report = run_end_to_end(tuple(configs or ["ptb-word-lstm-cpu", "ptb-word-mogrifier-cpu"]), steps,
                            default_command, out, log=typer.echo)
    typer.echo(markdown_table(report))
    typer.echo(f"written to {out}")

@app.command()
def budget(
    scale: str = typer.Option("cpu", help="smoke, cpu (the shipped CPU-budget configs: 1-2 hours) or paper."),
    data: Optional[str] = typer.Option(None, help="Your corpus instead of PTB word (a file or directory)."),
    data_format: str = typer.Option("word", help="Format of --data."),
    workers: int = typer.Option(2, min=1, help="Runs side by side (one thread each when 2 on two cores)."),
    root: Path = typer.Option(Path("experiments"), help="Where experiments keep their runs."),
) -> None:
    """LSTM vs Mogrifier at equal parameters and tokens: `moglm experiment run budget`, then its report."""
    from ..experiments.runner import run_experiment
    from ..report import write_report

    folder = run_experiment("budget", scale, root=root, data=data, data_format=data_format, workers=workers,
                            progress=workers == 1, log=typer.echo)
    typer.echo(write_report([folder]).read_text())

@app.command("hf-dyneval")
def hf_dyneval(
    layers: int = typer.Option(6, min=1, help="GPT-2 layers."),
    width: int = typer.Option(512, min=8, help="GPT-2 width (n_embd)."),
    heads: int = typer.Option(8, min=1, help="Attention heads."),
    context: list[int] = typer.Option([], help="Context lengths before each segment (default: 224 992)."),
    segment_length: int = typer.Option(32, "--segment-length", "-n", min=1, help="Tokens per segment."),
    tokens: int = typer.Option(1024, min=2, help="Tokens scored at each context length."),
    threads: Optional[int] = typer.Option(None, min=1, help="CPU threads for torch (default: torch's)."),
    out: Optional[Path] = typer.Option(None, help=OUT_HELP),
) -> None:
    """Dynamic evaluation of a GPT-2-shaped Hugging Face model against a static pass over the same tokens."""
    out = out or default_out("hf_dyneval.json")  # read at call time: $MOGLM_BENCH_DIR may change
    import torch

    from ..bench import command_line, write_report
    from ..bench.hf_dynamic_evaluation import markdown_table, run_hf_cost

    if threads is not None:
        torch.set_num_threads(threads)
    if width % heads:
        raise MoglmError(f"--width {width} is not a multiple of --heads {heads}")
    report = run_hf_cost(layers, width, heads, contexts=tuple(context) or (224, 992), segment=segment_length,
                         tokens=tokens, log=typer.echo)
    report["command"] = command_line()
    write_report(report, out)
    typer.echo(markdown_table(report))
    typer.echo(f"written to {out}")

@app.command("lm-eval")
def lm_eval_wikitext(
    run_dir: Path = typer.Argument(..., help="A run directory made by `moglm train`."),
    test_file: str = typer.Option("wikitext-2/test.txt", help="The tokenized WikiText test split (a corpus path: the "
                                  "working folder, then $MOGLM_DATA)."),
    task_dir: Optional[Path] = typer.Option(None, help="Where the local lm-eval task goes (default: under the user's "
                                            "cache, beside the default report)."),
    dynamic_args: str = typer.Option("", help="The dynamic row's model_args, key=value,... (default: the run's "
                                     "dyneval/full.json, else the defaults)."),
    detokenize: bool = typer.Option(False, help="Undo WikiText's tokenization first, as lm-eval's wikitext task does "
                                    "(for character, byte and subword runs)."),
    device: str = typer.Option("cpu", help=DEVICE_HELP),
    limit: Optional[int] = typer.Option(None, min=1, help="Only the first N articles."),
    threads: Optional[int] = typer.Option(None, min=1, help="CPU threads for torch (default: torch's)."),
    out: Optional[Path] = typer.Option(None, help=OUT_HELP),
) -> None:
    """lm-evaluation-harness's wikitext perplexity of a run on a local WikiText test split (one document per
    article), static and with dynamic evaluation: word perplexity, byte perplexity, bits per byte."""
    out = out or default_out("lm_eval_wikitext2.json")  # read at call time: $MOGLM_BENCH_DIR may change
    import torch

    from ..bench import write_report
    from ..bench.harness_wikitext import markdown_table, run_wikitext
    from ..data.corpus import resolve_path

    if threads is not None:
        torch.set_num_threads(threads)
    if bad := [item for item in dynamic_args.split(",") if item and "=" not in item]:
        raise MoglmError(f"--dynamic-args: {bad[0]!r} is not key=value")
    settings = dict(item.split("=", 1) for item in dynamic_args.split(",") if item)
    report = run_wikitext(run_dir, resolve_path(test_file), task_dir or default_out("lm_eval_wikitext2_task"),
                          settings, detokenize, device, limit, test_file, log=typer.echo)
    write_report(report, out)
    typer.echo(markdown_table(report))
    typer.echo(f"written to {out}")

@app.command()
def compress(
    run_dir: Path = typer.Argument(..., help="A character- or byte-level run made by `moglm train`."),
    file: Path = typer.Argument(..., help="The file to compress (e.g. a test split)."),
    dynamic: bool = typer.Option(False, help="Also compress with dynamic evaluation (a second row)."),
    rule: Optional[UpdateRule] = typer.Option(None, help="Update rule of the adaptation."),
    adapt_learning_rate: Optional[float] = typer.Option(None, help="Learning rate of the adaptation."),
    from_scratch: Optional[int] = typer.Option(None, min=0, metavar="SEED", help="Also compress from weights drawn "
                                               "afresh with this seed, learning while coding (another row)."),
    block_size: list[int] = typer.Option([], help="Bytes per block, one row (two with --dynamic) each: 0 4096 "
                                         "puts one stream beside blocks (default: moglm compress's, static and "
                                         "adapting)."),
    cache: bool = typer.Option(True, help="Code with moglm compress's neural cache (--no-cache: without)."),
    without_cache: bool = typer.Option(False, "--without-cache", help="Also code every row without the neural "
                                       "cache (a row each, measured in the same run)."),
    contexts: bool = typer.Option(True, help="Code with moglm compress's context mixer (--no-contexts: "
                                  "without)."),
    without_contexts: bool = typer.Option(False, "--without-contexts", help="Also code every row without the "
                                          "context mixer (a row each, measured in the same run)."),
    fast: bool = typer.Option(False, "--fast", help="Code with moglm compress --fast's lighter context mixer."),
    with_fast: bool = typer.Option(False, "--with-fast", help="Also code every row with moglm compress --fast's "
                                   "lighter context mixer (a row each, measured in the same run)."),
    match: bool = typer.Option(True, help="Code with moglm compress's match model (--no-match: without)."),
    without_match: bool = typer.Option(False, "--without-match", help="Also code every row without the match "
                                       "model (a row each, measured in the same run)."),
    threads: Optional[int] = typer.Option(None, min=1, help="Torch threads (default: moglm compress's)."),
    ensemble: list[Path] = typer.Option([], "--ensemble", metavar="RUN", help="Code every row with this run mixed "
                                        "in too (repeatable; moglm compress --ensemble)."),
    repeats: int = typer.Option(1, min=1, help="Round trips of each row, each checked; the speeds are their "
                                "medians."),
    progress: bool = typer.Option(True, help="Show progress bars."),
    out: Optional[Path] = typer.Option(None, help=OUT_HELP),
) -> None:
    """Compress and decompress a file with a run: size against the model's cross-entropy, gzip -9, bzip2 -9
    and xz -9, and the speed in KB/s of both directions."""
    out = out or default_out("compression.json")  # read at call time: $MOGLM_BENCH_DIR may change
    from ..compression.run import check_ensemble, context_settings, dynamic_settings, scratch_settings
    from ..bench import command_line, write_report
    from ..bench.compression import file_size, file_streams, markdown_table, run_compression

    from ..compression.container import THREADS, default_block_size

    check_ensemble(ensemble, from_scratch)
    adapting = dynamic or (from_scratch is None and (rule is not None or adapt_learning_rate is not None))
    scratch = [scratch_settings(from_scratch, rule, adapt_learning_rate)] if from_scratch is not None else []
    size = file_size(file)

    def ways(given: int | None) -> list:  # (settings, bytes per block): static, adapting, from scratch
        static, adapted = ((given, given) if given is not None
                           else (default_block_size(size, False), default_block_size(size, True)))
        return [(None, static)] + ([(dynamic_settings(run_dir, rule, adapt_learning_rate,
                                                      file_streams(run_dir, file, adapted)), adapted)]
                                   if adapting else []) + [(each, adapted) for each in scratch]

    context_settings(contexts, fast)  # --fast with --no-contexts is refused before any work
    mixes = ([(cache, contexts, match, fast)] + ([(False, contexts, match, fast)] if without_cache and cache else [])
             + ([(cache, False, match, False)] if without_contexts and contexts else [])
             + ([(cache, contexts, match, True)] if with_fast and contexts and not fast else [])
             + ([(cache, contexts, False, fast)] if without_match and match else []))  # (cache, mixer, match, fast)

    def members(settings: dict | None, size: int) -> list:  # the ensemble's runs, adapting where the row adapts
        return [(other, None if settings is None else dynamic_settings(
            other, rule, adapt_learning_rate, file_streams(other, file, size))) for other in ensemble]

    rows = [run_compression(run_dir, file, each, each_size, threads or THREADS, progress=progress, cache=mixed,
                            contexts=mixed_contexts, match=matched, log=typer.echo, repeats=repeats,
                            ensemble=members(each, each_size), fast=lighter)
            for given in block_size or [None] for each, each_size in ways(given)
            for mixed, mixed_contexts, matched, lighter in mixes]
    write_report({"command": command_line(), "rows": rows}, out)
    typer.echo(markdown_table(rows))
    typer.echo(f"written to {out}")

@app.command("export")
def export_check(
    run_dir: Path = typer.Argument(..., help="A run directory made by `moglm train` (its test split is read)."),
    tokens: int = typer.Option(2000, min=2, help="Test tokens whose logits are compared."),
    new_tokens: int = typer.Option(200, min=1, help="Tokens each greedy generation produces."),
    prompt: str = typer.Option("", help="Text the generations continue."),
    repeats: int = typer.Option(3, min=1, help="Timed generations of each kind, interleaved; the median counts."),
    threads: Optional[int] = typer.Option(None, min=1, help="CPU threads for torch (default: torch's)."),
    out: Optional[Path] = typer.Option(None, help=OUT_HELP),
) -> None:
    """A run exported to transformers against the run: max |logit difference| on its test split, and greedy
    generate() against moglm sample at temperature 0 in tokens/s."""
    out = out or default_out("export.json")  # read at call time: $MOGLM_BENCH_DIR may change
    import torch

    from ..bench import command_line, write_report
    from ..bench.export import markdown_table, run_export_check

    if threads is not None:
        torch.set_num_threads(threads)
    report = run_export_check(run_dir, tokens, new_tokens, prompt, repeats, log=typer.echo)
    report["command"] = command_line()
    write_report(report, out)
    typer.echo(markdown_table(report))
    typer.echo(f"written to {out}")
