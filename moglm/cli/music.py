"""``moglm music train | evaluate | dyneval | configs`` (mounted by :mod:`moglm.cli`); ``moglm sample`` on a music
run writes a MIDI file and a piano roll through :func:`moglm.music.run.sample_music_run`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import typer

from .common import Checkpoint, Split, deprecated, hyperparameter_overrides, new_app, renamed, values

Rule = Literal["sgd", "rms"]
MusicSplit = Literal["valid", "test"]


app = new_app("Polyphonic music: RNN-NADE / LSTM-NADE / Mogrifier-NADE (thesis 2.6, 4.8).")

@app.command()
def train(
    config: str = typer.Argument(..., help="A music config file or shipped name (`moglm music configs`)."),
    set_: list[str] = typer.Option([], "--set", "-s", help="Override a config key: section.key=value."),
    run_dir: Optional[Path] = typer.Option(None, help="Run directory (default: runs/<config name>)."),
    restart: bool = typer.Option(False, help="Discard an existing run in the run directory."),
    learning_rate: Optional[float] = typer.Option(None, help="Sets train.learning_rate."),
    max_steps: Optional[int] = typer.Option(None, min=1, help="Sets train.max_steps."),
    batch_size: Optional[int] = typer.Option(None, min=1, help="Sets train.batch_size."),
    hidden_size: Optional[int] = typer.Option(None, min=1, help="Sets model.hidden_size."),
    threads: Optional[int] = typer.Option(None, min=1, help="Sets train.threads."),
    seed: Optional[int] = typer.Option(None, min=0, max=2**63 - 1, help="Sets train.seed."),
    progress: bool = typer.Option(True, help="Show progress bars."),
) -> None:
    """Train an RNN-NADE on songs (rerun the same command to resume), evaluate it and write a sample."""
    from ..music.config import load_music_config
    from ..music.training import MusicRun, train_music

    overrides = hyperparameter_overrides(False, learning_rate=learning_rate, max_steps=max_steps,
                                         batch_size=batch_size, hidden_size=hidden_size, threads=threads, seed=seed)
    cfg = load_music_config(config, [*set_, *overrides])
    path = run_dir or Path("runs") / (cfg.name or "music")
    if restart and path.exists():
        MusicRun(path).discard()
    train_music(cfg, path, progress=progress, log=typer.echo)
    typer.echo(f"run directory: {path}")

@app.command()
def evaluate(
    run_dir: Path = typer.Argument(..., help="A run directory made by `moglm music train`."),
    split: list[Split] = typer.Option([], help="Split(s) to score (default: the config's)."),
    checkpoint: Checkpoint = typer.Option("best", help="The best or the last checkpoint."),
    progress: bool = typer.Option(True, help="Show progress bars."),
) -> None:
    """Log-likelihood per frame of whole songs (thesis table 4.6), each from a zero state."""
    from ..music.run import evaluate_music_run, music_run

    evaluate_music_run(music_run(run_dir), values(split) or None, checkpoint, progress, typer.echo)

@app.command()
def dyneval(
    run_dir: Path = typer.Argument(..., help="A run directory made by `moglm music train`."),
    rule: Rule = typer.Option("rms", help="sgd, or rms: global RMS (eq. 4.4), both without decay (thesis 4.8)."),
    split: MusicSplit = typer.Option("test", help="The split scored."),
    search: bool = typer.Option(False, help="Search the learning rate and segment length on the validation songs "
                                "first (as `moglm dyneval --search`)."),
    learning_rate: Optional[float] = typer.Option(None, min=0.0, help="Learning rate (with --search: where it "
                                                  "starts)."),
    lr: Optional[float] = deprecated("--lr", min=0.0),
    segment_length: Optional[int] = typer.Option(None, "--segment-length", "-n", min=1,
                                                  help="Frames per segment (one update each)."),
    checkpoint: Checkpoint = typer.Option("best", help="The best or the last checkpoint."),
    progress: bool = typer.Option(True, help="Show progress bars."),
) -> None:
    """Dynamic evaluation of songs: weights and state reset at every song (thesis 4.8)."""
    from ..music.run import dyneval_music_run, music_run

    dyneval_music_run(music_run(run_dir), rule, (split,), search, renamed(learning_rate, lr, "--lr",
                      "--learning-rate"), segment_length, checkpoint, progress, typer.echo)

@app.command()
def configs() -> None:
    """List the music configs that ship with moglm."""
    from ..runs.config import read_mapping
    from ..music.config import shipped_music_configs

    for name, path in shipped_music_configs().items():
        typer.echo(f"{name:32s} {read_mapping(path).get('description', '')}")
