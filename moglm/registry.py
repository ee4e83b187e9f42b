"""The workload registry: what moglm trains, tunes and reports, as plug-ins.

A :class:`Workload` is one kind of job: the language model, polyphonic music, the synthetic tasks (reverse
copy, Dyck-k), and dynamic evaluation as a tuning target. It names its config type, how an experiment's run
trains and is evaluated, its tuning problem, how its best trial is reported, and its command group. The
experiments, the tuner and the command line look a workload up here (by an experiment's ``kind`` or a
search space's ``target``) and call its hooks; none of them compares workload names.

Hooks are ``"module:attribute"`` strings imported on first use, as entry points are, so that looking a
workload up imports nothing heavy and the layers below never import the workloads above them. A package
outside moglm adds a workload through the ``moglm.workloads`` entry-point group, whose entries are
:class:`Workload` objects.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import MoglmError

#: every hook a workload may name, and what it is called with
HOOKS = {
    "config": "its typed config (a pydantic model class)",
    "experiment_config": "(run spec) -> the run's resolved config, whose digest says whether two runs are one",
    "experiment_runs": "(experiment, scale, data) -> its run specs, where the corpus x variant x seed grid does not apply",
    "experiment_run": "(experiment, scale name, run spec, run dir, evaluations, progress, log, sizes) -> None",
    "tuning_prepare": "(space, space name, base, overrides, max tokens, study dir) -> the trials' setup",
    "tuning_key_problem": "(dotted key) -> why the key names no field of a trial's settings, or None",
    "tuning_best": "(study result, best trial, storage URL) -> (label, file name, text) of its best settings",
}


@dataclass(frozen=True)
class Workload:
    """One kind of job and its hooks (:data:`HOOKS`)."""

    name: str
    description: str
    experiment_kind: str | None = None  # an experiment definition's ``kind``
    tuning_target: str | None = None  # a search space's ``target``
    hooks: Mapping[str, str] = field(default_factory=dict)
    seed_key: str = "train.seed"  # the config key an experiment's seed sets
    evaluations: tuple[str, ...] | None = None  # the experiment evaluations it supports (None: all)
    data_format: bool = True  # whether a user's ``--data`` comes with a ``--data-format``
    trial_trains: bool = True  # whether a tuning trial trains (dynamic evaluation's trials only score)
    commands: tuple[str, str] | None = None  # (group name, "module:typer app") mounted as ``moglm <group>``

    def __post_init__(self) -> None:
        unknown = set(self.hooks) - set(HOOKS)
        if unknown:
            raise ValueError(f"workload {self.name}: unknown hook {sorted(unknown)[0]!r} (hooks: {', '.join(HOOKS)})")

    def has(self, hook: str) -> bool:
        return hook in self.hooks

    def hook(self, hook: str) -> Callable[..., Any]:
        """The hook's object, imported now; a workload without it is a one-line error."""
        if hook not in self.hooks:
            raise MoglmError(f"the {self.name} workload has no {hook.replace('_', ' ')}")
        return load(self.hooks[hook])


def load(reference: str) -> Any:
    """The object named ``"package.module:attribute"``."""
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)


BUILTIN = (
    Workload(
        "language_model", "language models over words, characters or bytes (moglm train)",
        experiment_kind="language_model", tuning_target="train",
        hooks={"config": "moglm.runs.config:RunConfig",
               "experiment_config": "moglm.workloads.language_model:experiment_config",
               "experiment_run": "moglm.workloads.language_model:experiment_run",
               "tuning_prepare": "moglm.workloads.language_model:tuning_prepare",
               "tuning_key_problem": "moglm.workloads.language_model:tuning_key_problem",
               "tuning_best": "moglm.workloads.language_model:tuning_best"}),
    Workload(
        "music", "polyphonic music with RNN-NADE / LSTM-NADE / Mogrifier-NADE (moglm music)",
        experiment_kind="music", seed_key="train.seed", evaluations=("static", "dynamic_sgd", "dynamic_rms"), data_format=False,
        hooks={"config": "moglm.music.config:MusicConfig",
               "experiment_config": "moglm.workloads.music:experiment_config",
               "experiment_run": "moglm.workloads.music:experiment_run"},
        commands=("music", "moglm.cli.music:app")),
    Workload(
        "reverse_copy", "the reverse-copy task (moglm task reverse-copy)",
        experiment_kind="reverse_copy", tuning_target="reverse-copy", seed_key="seed",
        hooks={"config": "moglm.tasks.reverse_copy:ReverseCopyConfig",
               "experiment_config": "moglm.workloads.reverse_copy:experiment_config",
               "experiment_runs": "moglm.workloads.reverse_copy:experiment_runs",
               "experiment_run": "moglm.workloads.reverse_copy:experiment_run",
               "tuning_prepare": "moglm.workloads.reverse_copy:tuning_prepare",
               "tuning_key_problem": "moglm.workloads.reverse_copy:tuning_key_problem",
               "tuning_best": "moglm.workloads.reverse_copy:tuning_best"},
        commands=("task", "moglm.cli.task:app")),
    Workload(
        "dyck", "bounded Dyck-k languages and their WCPA (moglm task dyck)",
        hooks={"config": "moglm.tasks.dyck_training:DyckTraining"},
        commands=("task", "moglm.cli.task:app")),
    Workload(
        "dynamic_evaluation", "dynamic evaluation of a trained run, as a tuning target (moglm dyneval)",
        tuning_target="dyneval", trial_trains=False,
        hooks={"tuning_prepare": "moglm.workloads.dynamic_evaluation:tuning_prepare",
               "tuning_key_problem": "moglm.workloads.dynamic_evaluation:tuning_key_problem",
               "tuning_best": "moglm.workloads.dynamic_evaluation:tuning_best"}),
)


def workloads() -> tuple[Workload, ...]:
    """The built-in workloads, then those of installed packages (entry-point group ``moglm.workloads``)."""
    from importlib.metadata import entry_points

    found = list(BUILTIN)
    for entry in entry_points(group="moglm.workloads"):
        workload = entry.load()
        if not isinstance(workload, Workload):
            raise MoglmError(f"entry point {entry.name} ({entry.value}) is not a moglm.registry.Workload")
        found.append(workload)
    return tuple(found)


def _find(attribute: str, value: str, what: str) -> Workload:
    matches = [w for w in workloads() if getattr(w, attribute) == value]
    if not matches:
        known = sorted({getattr(w, attribute) for w in workloads() if getattr(w, attribute)})
        raise MoglmError(f"no workload for {what} {value!r} (known: {', '.join(known)})")
    return matches[0]


def for_experiment(kind: str) -> Workload:
    """The workload of an experiment definition's ``kind``."""
    return _find("experiment_kind", kind, "experiment kind")


def for_tuning(target: str) -> Workload:
    """The workload of a search space's ``target``."""
    return _find("tuning_target", target, "tuning target")


def command_groups() -> dict[str, str]:
    """Group name -> ``"module:typer app"`` of every workload's commands (a group shared by two workloads
    once)."""
    return dict(w.commands for w in workloads() if w.commands is not None)
