"""``moglm tune``: hyperparameter tuning with Optuna (thesis-style searches; many machines through a shared
storage)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from ..errors import MoglmError
from ..registry import for_tuning
from .common import Sampler, deprecated, renamed


def tune(
    space: Optional[str] = typer.Argument(None, help="Search-space file (TOML/YAML) or shipped space name."),
    base: Optional[str] = typer.Option(None, help="Run config every trial starts from (default: the space's)."),
    set_: list[str] = typer.Option([], "--set", "-s", help="Override a base-config key: section.key=value."),
    trials: Optional[int] = typer.Option(None, min=0, help="Trials in the study in total, 0 to create it only "
                                         "(default: the space's)."),
    timeout: Optional[str] = typer.Option(None, help="Wall time, e.g. 3600, 90m, 2h: no trial starts after it."),
    train_tokens: Optional[int] = typer.Option(
        None, min=1, help="Training tokens per trial (sets train.max_tokens; default: the space's budget)."),
    eval_tokens: Optional[int] = typer.Option(
        None, min=1, help="Dynamic-evaluation spaces: validation tokens each trial scores (default: the "
        "space's budget, else 10,000)."),
    max_tokens: Optional[int] = deprecated("--max-tokens", min=1),
    workers: int = typer.Option(1, help="Worker processes on this machine."),
    threads: Optional[int] = typer.Option(None, min=1, help="Torch threads per worker (default: cores / workers)."),
    storage: Optional[str] = typer.Option(None, help="Optuna storage: a journal file, or a database URL such as "
                                          "postgresql+psycopg://user@host/db (default: study.journal in the "
                                          "study dir)."),
    worker: bool = typer.Option(False, "--worker", help="Join the existing study in --storage and run its trials "
                                "until its budget is spent (its base, --set and token budget come from it)."),
    study_name: Optional[str] = typer.Option(None, help="Study name (default: the space's name)."),
    study_dir: Optional[Path] = typer.Option(None, help="Trials and reports (default: studies/<study name>)."),
    sampler: Optional[Sampler] = typer.Option(None, help="Optuna sampler (default: the space's)."),
    seed: Optional[int] = typer.Option(None, help="Sampler seed (default: the space's)."),
    keep_checkpoints: bool = typer.Option(False, help="Keep every trial's checkpoints (default: the best's)."),
    plots: bool = typer.Option(True, help="Draw the plots (parallel coordinates, history, importances)."),
    progress: bool = typer.Option(True, help="Show a progress bar per trial (one worker) and a line per "
                                  "evaluation."),
    list_spaces: bool = typer.Option(False, "--list", help="List the shipped search spaces and exit."),
) -> None:
    """Tune hyperparameters with Optuna (rerun to resume; workers elsewhere join through --storage)."""
    try:
        from ..tune import run_study, shipped_spaces, write_report
        from ..tune.search_space import load_space
    except ImportError as e:
        missing = f"moglm tune needs the tune extra ({e.name} is missing)"
        raise MoglmError(f"{missing}: pip install 'moglm[tune]'") from None

    if list_spaces or space is None:
        for name in shipped_spaces():
            typer.echo(f"{name:20s} {load_space(name)[0].description or ''}")
        return
    tokens = trial_tokens(for_tuning(load_space(space)[0].target).trial_trains, train_tokens, eval_tokens, max_tokens)
    result = run_study(space, base=base, overrides=set_, study_name=study_name, study_dir=study_dir,
                       storage=storage, workers=workers, threads=threads, trials=trials,
                       timeout=seconds(timeout), max_tokens=tokens, sampler=sampler,
                       seed="space" if seed is None else seed, keep_checkpoints=keep_checkpoints, log=typer.echo,
                       progress=progress, worker=worker)
    if int(os.environ.get("RANK", "0")):  # torchrun: rank 0 reports
        return
    typer.echo(write_report(result, plots=plots), nl=False)
    if result.failed_workers:
        raise MoglmError("; ".join(result.failed_workers) + " (rerun the same command to continue the study)")


def trial_tokens(trains: bool, train_tokens: Optional[int], eval_tokens: Optional[int],
                  max_tokens: Optional[int]) -> Optional[int]:
    """The token budget of each trial (the space's ``budget.max_tokens``): ``--train-tokens`` for a space that
    trains, ``--eval-tokens`` for one that tunes dynamic evaluation (or ``--max-tokens``, their old name)."""
    if not trains and train_tokens is not None:
        raise MoglmError("--train-tokens: this space tunes dynamic evaluation, which trains nothing; "
                         "--eval-tokens sets the validation tokens each trial scores")
    if trains and eval_tokens is not None:
        raise MoglmError("--eval-tokens applies to dynamic-evaluation spaces; --train-tokens sets a trial's "
                         "training tokens")
    new = "--train-tokens" if trains else "--eval-tokens"
    return renamed(train_tokens if eval_tokens is None else eval_tokens, max_tokens, "--max-tokens", new)


def seconds(text: Optional[str]) -> Optional[float]:
    """``3600``, ``90s``, ``90m``, ``2h`` or ``1d`` in seconds."""
    if text is None:
        return None
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    number, unit = (text[:-1], units[text[-1]]) if text and text[-1] in units else (text, 1)
    try:
        value = float(number) * unit
    except ValueError:
        raise MoglmError(f"--timeout: expected seconds or a number with s, m, h or d, got {text!r}") from None
    if value <= 0:
        raise MoglmError(f"--timeout must be positive, got {text!r}")
    return value
