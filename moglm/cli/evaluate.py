"""``moglm evaluate``: score a trained run and write results.json."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .common import DEVICE_HELP, Checkpoint, Split, deprecated, renamed, values


def evaluate(
    run_dir: Path = typer.Argument(..., help="A run directory made by `moglm train`."),
    split: list[Split] = typer.Option([], help="Split(s) to evaluate (default: the config's)."),
    batch_size: Optional[int] = typer.Option(None, help="Streams (1: one continuous stream)."),
    logit_factor: Optional[float] = typer.Option(
        None, help="Multiply the logits by this factor, the inverse of a softmax temperature (default: the "
        "factor searched on valid)."),
    temperature: Optional[float] = deprecated("--temperature"),
    mc_samples: Optional[int] = typer.Option(None, help="MC-dropout samples (0: off)."),
    mc_dropout_multiplier: Optional[float] = typer.Option(None, help="MC dropout: rates are multiplied by this."),
    checkpoint: Checkpoint = typer.Option("best", help="The best or the last checkpoint."),
    device: Optional[str] = typer.Option(None, help=f"{DEVICE_HELP} (default: the run's)."),
    cuda_graphs: Optional[bool] = typer.Option(
        None, "--cuda-graphs/--no-cuda-graphs", help="Replay the recurrent layers' fused windows as CUDA graphs "
        "(default: on a CUDA device). --cuda-graphs on CPU is an error."),
    progress: bool = typer.Option(True, help="Show progress bars."),
) -> None:
    """Evaluate a trained run (perplexity, bits per character/word) and write results.json."""
    from ..train.final_evaluation import evaluate_run
    from ..runs.language_model import LanguageModelRun

    split = values(split)
    logit_factor = renamed(logit_factor, temperature, "--temperature", "--logit-factor")
    evaluate_run(LanguageModelRun(run_dir), split or None, batch_size, logit_factor, mc_samples,
                 mc_dropout_multiplier, checkpoint, device, progress, typer.echo,
                 write=(not split and checkpoint == "best"), cuda_graphs=cuda_graphs)
