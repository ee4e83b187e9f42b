"""What a study leaves behind: the best trial as a ready-to-train config, a text summary, the plots.

Everything is rebuilt from the storage alone (each trial records its config as a user attribute), so
any machine that can reach the storage can write the report, wherever the trials ran.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from ..atomic import atomic_write_text
from ..evaluation.scores import in_unit
from ..registry import for_tuning
from ..runs.config import validate
from .plots import plot_study
from .study import StudyResult, best_trial, counted_trials, public_url


def _score(value: float, level: str | None) -> str:
    if level == "reverse-copy":
        return f"valid xent {value:.4f} nats per decoded token"
    return f"valid xent {value:.4f} ({in_unit(value, level or 'char')})"


def best_config_text(result: StudyResult, best: optuna.trial.FrozenTrial) -> str:
    """The best trial's ready-to-train config, provenance in comments and in ``description``."""
    study, setup = result.study, result.setup
    level = best.user_attrs.get("level")
    data = dict(best.user_attrs["config"])
    data["name"] = f"{study.study_name}-best"
    data["description"] = (f"best trial ({best.number}) of Optuna study {study.study_name!r}: "
                           f"{_score(best.value, level)}; tuned from {setup.base_name}")
    text = validate(data, "best config").to_toml()
    changed = best.user_attrs.get("changed") or {}
    lines = [f"# moglm tune: the best trial of Optuna study {study.study_name!r}",
             f"# storage: {public_url(result.storage)}",
             f"# search space: {study.user_attrs.get('space', setup.space_name)}; base config: {setup.base_name}",
             f"# trial {best.number} of {len(counted_trials(study))}: {_score(best.value, level)}, "
             f"softmax temperature {best.user_attrs.get('temperature', 1.0):.2f}",
             "# tuned: " + ", ".join(f"{k} = {_fmt(v)}" for k, v in best.params.items())]
    if changed:
        lines.append("# changed before training: " + ", ".join(f"{k} = {v}" for k, v in changed.items())
                     + " (rank above min(embedding, hidden) size: full rank)")
    if setup.trial_overrides:
        lines.append("# the trials also had " + ", ".join(f"{k} = {v}" for k, v in setup.trial_overrides.items())
                     + " (not kept here: this config trains with the base's budget)")
    return "\n".join(lines) + "\n\n" + text


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else repr(value)


def summary_text(result: StudyResult, outputs: dict[str, Path]) -> str:
    study = result.study
    trials = counted_trials(study)
    states = {s: sum(t.state == s for t in trials) for s in TrialState}
    objective = {"dyneval": "dynamic-evaluation cross-entropy (nats/token) on a validation prefix",
                 "reverse-copy": "reverse copy: validation cross-entropy (nats per decoded token)"}.get(
        result.setup.space.target, "validation cross-entropy (nats/token), averaged weights, tuned temperature")
    lines = [f"study {study.study_name!r} ({public_url(result.storage)})",
             f"base {result.setup.base_name}, search space {result.setup.space_name}; objective: {objective}",
             f"trials: {len(trials)}"]
    if trials:
        lines[-1] += " (" + ", ".join(f"{n} {s.name.lower()}" for s, n in states.items() if n) + ")"
    best = best_trial(study)
    if best is None:
        lines.append("no completed trial yet")
    else:
        level = best.user_attrs.get("level")
        size = (f", {best.user_attrs['num_params']:,} parameters (hidden {best.user_attrs['hidden_size']})"
                if "num_params" in best.user_attrs else "")
        lines.append(f"best: trial {best.number}, {_score(best.value, level)}, temperature "
                     f"{best.user_attrs.get('temperature', 1.0):.2f}{size}")
        width = max(len(k) for k in best.params)
        lines += [f"  {k:{width}s} = {_fmt(v)}" for k, v in best.params.items()]
        for k, v in (best.user_attrs.get("changed") or {}).items():
            lines.append(f"  ({k} trained as {v}: full rank)")
        done = sorted((t for t in trials if t.state == TrialState.COMPLETE and t.value is not None),
                      key=lambda t: t.value)
        lines.append("top trials: " + ", ".join(f"#{t.number} {t.value:.4f}" for t in done[:5]))
    for t in trials:
        if t.state == TrialState.FAIL:
            lines.append(f"failed: trial {t.number}: {t.user_attrs.get('error', 'worker died (heartbeat)')}")
    for message in result.failed_workers:
        lines.append(f"warning: {message}")
    for what, path in outputs.items():
        lines.append(f"{what}: {path}")
    return "\n".join(lines) + "\n"


def write_report(result: StudyResult, plots: bool = True) -> str:
    """best.toml, the plots and summary.txt in the study directory; returns the summary."""
    directory = result.directory
    outputs: dict[str, Path] = {}
    best = best_trial(result.study)
    if best is not None and "config" in best.user_attrs:
        label, name, text = for_tuning(result.setup.space.target).hook("tuning_best")(result, best,
                                                                                     public_url(result.storage))
        outputs[label] = directory / name
        atomic_write_text(outputs[label], text)
    if plots:
        outputs.update(plot_study(result.study, result.setup.space, directory))
    summary = summary_text(result, outputs)
    atomic_write_text(directory / "summary.txt", summary)
    return summary

