"""``moglm train``: train a language model, evaluate it and print a sample."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .common import deprecated, hyperparameter_overrides, renamed
from .sample import generate


def train(
    config: Optional[str] = typer.Argument(None, help="Config file (TOML/YAML) or shipped config name "
                                                      "(default: default; `moglm configs` lists them)."),
    set_: list[str] = typer.Option([], "--set", "-s", help="Override a config key: section.key=value."),
    run_dir: Optional[Path] = typer.Option(None, help="Run directory (default: runs/<config name>)."),
    restart: bool = typer.Option(False, help="Discard an existing run in the run directory."),
    learning_rate: Optional[float] = typer.Option(None, help="Sets train.learning_rate."),
    lr: Optional[float] = deprecated("--lr"),
    max_steps: Optional[int] = typer.Option(None, min=1, help="Sets train.max_steps."),
    batch_size: Optional[int] = typer.Option(None, min=1, help="Sets train.batch_size."),
    hidden_size: Optional[int] = typer.Option(None, min=1, help="Sets model.hidden_size (instead of a parameter "
                                              "budget)."),
    threads: Optional[int] = typer.Option(None, min=1, help="Sets train.threads."),
    seed: Optional[int] = typer.Option(None, min=0, max=2**63 - 1, help="Sets train.seed."),
    progress: bool = typer.Option(True, help="Show progress bars."),
    help_config: bool = typer.Option(False, "--help-config", help="Describe every config field and exit."),
    nproc_per_node: Optional[int] = typer.Option(
        None, min=1, help="Data-parallel training: this many processes (torchrun), each training a block of the "
        "batch's rows."),
) -> None:
    """Train a language model (rerun the same command to resume), evaluate it and print a sample."""
    from ..atomic import atomic_write_text
    from .. import distributed
    from ..runs.config import describe, load_config
    from ..train.final_evaluation import final_block
    from ..runs.language_model import LanguageModelRun
    from ..train.trainer import train_and_evaluate

    if help_config:
        typer.echo(describe())
        return
    set_ = [*set_, *hyperparameter_overrides(
        learning_rate=renamed(learning_rate, lr, "--lr", "--learning-rate"), max_steps=max_steps,
        batch_size=batch_size, hidden_size=hidden_size, threads=threads, seed=seed)]
    cfg = load_config(config or "default", set_)
    path = run_dir or Path("runs") / (cfg.name or "default")
    if nproc_per_node is not None and not distributed.launched():
        args = [config or "default", *[a for s in set_ for a in ("--set", s)], "--run-dir", str(path),
                *(["--restart"] if restart else []), *([] if progress else ["--no-progress"])]
        distributed.launch(nproc_per_node, ["train", *args])
        return
    if restart and path.exists() and distributed.is_main_process():
        LanguageModelRun(path).discard()  # refused, and nothing removed, while a trainer runs there
    _, results = train_and_evaluate(cfg, path, progress=progress, log=typer.echo)
    if not distributed.is_main_process():
        return
    for line in final_block(results, cfg):
        typer.echo(line)
    run = LanguageModelRun(path)
    from ..sampling import NoStart

    try:
        text = generate(run, cfg.sample.prompt, cfg.sample.num_tokens, cfg.sample.temperature, cfg.sample.top_k,
                       cfg.train.seed) if cfg.sample.num_tokens else None
    except NoStart:  # said after the final scores: the run trained all the same
        text = None
    if text is not None:
        atomic_write_text(run.sample_path, text + "\n")
        typer.echo(f"--- sample ---\n{text}\n--------------")
    typer.echo(f"run directory: {path}")
