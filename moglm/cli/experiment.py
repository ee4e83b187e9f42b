"""``moglm experiment list | run | status`` and ``moglm report``."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import typer

from .common import new_app

ScaleName = Literal["smoke", "cpu", "paper"]
DataFormat = Literal["char", "word", "ptb_char", "byte"]


app = new_app("The papers' experiments: list, run, status.")

@app.command("list")
def list_() -> None:
    """The shipped experiments, what each reproduces, and its runs at each scale."""
    from ..experiments.spec import load_experiment, runs, shipped

    for name in shipped():
        exp = load_experiment(name)
        count = "analysis of " + exp.uses if exp.is_analysis else f"{len(runs(exp, 'cpu'))} runs"
        typer.echo(f"{name:14s} {exp.source}: {exp.description} ({count})")

@app.command()
def run(
    name: str = typer.Argument(..., help="A shipped experiment (`moglm experiment list`) or a TOML file."),
    scale: ScaleName = typer.Option("cpu", help="smoke: under a minute a run; cpu: hours on two cores; paper: a GPU's days."),
    workers: int = typer.Option(1, min=1, help="Runs trained at once (processes; the cores are shared)."),
    data: Optional[str] = typer.Option(None, help="Your corpus instead of the experiment's (file or directory)."),
    data_format: DataFormat = typer.Option("char", help="Format of --data."),
    root: Path = typer.Option(Path("experiments"), help="Where experiments keep their runs."),
    only: list[str] = typer.Option([], help="Only these runs (names as `status` shows them; repeat the option or "
                                   "separate names by commas)."),
    progress: bool = typer.Option(True, help="Show progress bars (one worker)."),
) -> None:
    """Train and evaluate every run of an experiment; rerun the same command to resume."""
    from ..experiments.runner import run_experiment

    run_experiment(name, scale, root=root, data=data, data_format=data_format, workers=workers,
                   only=[n.strip() for o in only for n in o.split(",") if n.strip()] or None, progress=progress,
                   log=typer.echo)

@app.command()
def status(
    name: str = typer.Argument(..., help="A shipped experiment or a TOML file."),
    scale: ScaleName = typer.Option("cpu", help="The scale it ran at."),
    data: Optional[str] = typer.Option(None, help="The --data it ran with."),
    data_format: DataFormat = typer.Option("char", help="Format of --data."),
    root: Path = typer.Option(Path("experiments"), help="Where experiments keep their runs."),
) -> None:
    """Each run's state: not started, training, evaluating, done."""
    from ..experiments.runner import status as run_status

    for row in run_status(name, scale, root, data, data_format):
        done = ", ".join(row["evaluations"]) or "-"
        typer.echo(f"{row['run']:32s} {row['state']:24s} evaluations: {done}")


def report(
    paths: list[Path] = typer.Argument(..., help="An experiment folder (experiments/<name>/<scale>) or run "
                                                  "directories."),
    out: Optional[Path] = typer.Option(None, help="Folder for report.md and its figures (default: the experiment "
                                                  "folder, or ./report)."),
    bundle: bool = typer.Option(False, help="Copy every result file the report cites beside it (runs/<run>/...) "
                                "and link there, so the folder can be committed or shared on its own."),
) -> None:
    """Write a markdown report (tables, figures, the papers' numbers) from run directories; trains nothing."""
    from ..report import write_report

    path = write_report(list(paths), out, bundle=bundle)
    typer.echo(f"report: {path}")
