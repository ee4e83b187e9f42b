"""``moglm export``: a trained run as a directory Hugging Face transformers loads (config, safetensors weights,
tokenizer, model card), optionally pushed to the Hub."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .common import Checkpoint


def export(
    run_dir: Path = typer.Argument(..., help="A run directory made by `moglm train`."),
    out: Path = typer.Argument(..., help="The folder to write; AutoModelForCausalLM.from_pretrained(OUT) reads it."),
    force: bool = typer.Option(False, "--force", "-f", help="OUT exists: replace the files an export writes in it "
                               "(nothing else in OUT is touched)."),
    checkpoint: Checkpoint = typer.Option("best", help="The best or the last checkpoint's weights."),
    push_to_hub: Optional[str] = typer.Option(None, "--push-to-hub", metavar="REPO",
                                              help="Also upload OUT to this Hub repository (user/name), created if "
                                              "missing, with huggingface_hub and your saved token."),
    private: bool = typer.Option(False, help="With --push-to-hub: create the repository private."),
) -> None:
    """Export a run to Hugging Face transformers: config, safetensors weights, the run's vocabulary as a tokenizer,
    and a model card; optionally push it to the Hub."""
    from ..export.run import export_run

    export_run(run_dir, out, force, checkpoint, push_to_hub, private, typer.echo)
