"""The ``moglm`` Typer app: the commands of this package, and each workload's command group
(:func:`moglm.registry.command_groups`)."""

from __future__ import annotations

import typer

from ..registry import command_groups, load
from . import (bench, compress, configs, dynamic_evaluation, evaluate, experiment, export, harness, info,
               related_words, sample, train, tune)
from .common import new_app

#: top-level commands, in the order ``moglm --help`` lists them: (name, function)
COMMANDS = (
    ("train", train.train), ("evaluate", evaluate.evaluate), ("sample", sample.sample),
    ("related-words", related_words.related_words), ("configs", configs.configs), ("info", info.info),
    ("tune", tune.tune), ("dyneval", dynamic_evaluation.dyneval), ("compress", compress.compress),
    ("decompress", compress.decompress), ("export", export.export), ("report", experiment.report),
    ("lm-eval", harness.lm_eval),
)
#: command groups of no single workload: (name, app, help)
GROUPS = (
    ("experiment", experiment.app, "The papers' experiments: list, run, status."),
    ("bench", bench.app, "Benchmarks: throughput against nn.LSTM; equal-budget comparisons."),
)


def show_version(value: bool) -> None:
    if value:
        from .. import __version__

        typer.echo(f"moglm {__version__}")
        raise typer.Exit()


def root(
    version: bool = typer.Option(False, "--version", callback=show_version, is_eager=True,
                                 help="Print moglm's version and exit."),
) -> None:
    """Mogrifier LSTM and other input-dependent recurrent language models."""


def build_app() -> typer.Typer:
    """A new ``moglm`` app with every command and group mounted."""
    app = new_app("Mogrifier LSTM and other input-dependent recurrent language models.", name="moglm",
                  add_completion=False, pretty_exceptions_enable=False)
    app.callback()(root)
    for name, function in COMMANDS:
        app.command(name, **getattr(function, "command_options", {}))(function)
    groups = [(name, group, help) for name, group, help in GROUPS]
    for name, reference in command_groups().items():
        group = load(reference)
        groups.append((name, group, group.info.help))
    for name, group, help in sorted(groups, key=lambda g: g[0]):
        app.add_typer(group, name=name, help=help)
    return app
