"""Tuning the reverse-copy task (search spaces with ``target = "reverse-copy"``, Mogrifier paper 4.3: the
learning rate and the l2 penalty tuned per model).

Keys are :class:`moglm.tasks.reverse_copy.ReverseCopyConfig` fields (``learning_rate``, ``l2_penalty``,
``input_embedding_ratio``, ``cell.rounds``, ...): ``[fixed]`` and ``--set key=value`` (``overrides``) give
the task and its budget (``length`` or ``min_length``/``max_length``, ``vocab_size``, ``train_examples``,
``num_params``, ``architecture``, ``steps``, ...; an overriding ``length`` replaces the space's
``min_length``/``max_length``), ``[params]`` what is tuned. Every trial trains a run in
``<study dir>/trials/<n>`` with the training engine (:func:`moglm.tasks.reverse_copy.run_reverse_copy`,
validation only), reporting each validation to the trial so the pruner can stop it early; the objective is
the best checkpoint's validation cross-entropy (nats per decoded token). A trial budget in tokens
(``--train-tokens``, ``budget.max_tokens``) sets ``steps``. The study directory records the fixed settings
(``fixed.json``): resuming the study with other fixed settings is an error.

From code, :func:`tune_reverse_copy` runs (or resumes) a study and returns the best parameters.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna

from ..atomic import atomic_write_text
from ..errors import MoglmError
from ..runs.directory import first_difference, plain
from ..tasks.reverse_copy import ReverseCopyConfig, run_reverse_copy
from ..runs.config import apply_overrides, validate_cell_options
from .objective import Objective, TrialSetup
from .search_space import SearchSpace, set_dotted

FIELDS = tuple(f.name for f in dataclasses.fields(ReverseCopyConfig))


def key_problem(key: str) -> str | None:
    """Why ``key`` names no reverse-copy setting (``None`` when it does): a field, or ``cell.<option>``."""
    parts = key.split(".")
    if parts[0] not in FIELDS:
        return f"not a reverse-copy setting ({', '.join(FIELDS)})"
    if len(parts) > 1 and (parts[0] != "cell" or len(parts) > 2 or not parts[1]):
        return "only cell takes sub-keys (cell.rounds, cell.rank, ...)"
    return None


@dataclasses.dataclass
class ReverseCopySetup(TrialSetup):
    """A reverse-copy study: ``base`` is the mapping of fixed settings (the space's ``[fixed]`` and the
    overrides), ``trial_overrides`` its ``[trial]`` and the steps of a token budget; picklable for workers."""

    device: str = "auto"  # where trials train: CUDA when available

    def build_config(self, mapping: dict[str, Any]) -> ReverseCopyConfig:
        try:
            cfg = ReverseCopyConfig(**mapping)
            validate_cell_options(cfg.architecture, cfg.cell)  # before any trial trains
            return cfg
        except (TypeError, ValueError) as e:
            raise MoglmError(f"{self.space_name}: {e}") from None

    def objective(self) -> "ReverseCopyObjective":
        return ReverseCopyObjective(self)

    def pruning_warmup_steps(self) -> tuple[int, int, int]:
        _, cfg = self.configs(self.representative_values())
        return int(self.space.pruner.warmup * cfg.steps), cfg.steps, cfg.eval_every


def prepare_reverse_copy(space: SearchSpace, space_name: str, base: str | None, overrides: list[str],
                         max_tokens: int | None, study_dir: Path, device: str = "auto") -> ReverseCopySetup:
    """Check the settings (a config for a representative trial) and record them in the study directory."""
    if base is not None:
        raise MoglmError(f"search space {space_name} tunes the reverse-copy task: it takes no --base "
                         "(give its settings in [fixed] or with --set key=value)")
    fixed: dict[str, Any] = {}
    for key, value in space.fixed.items():
        set_dotted(fixed, key, value)
    given = {item.partition("=")[0].strip() for item in overrides}
    if "length" in given and not given & {"min_length", "max_length"}:  # a length replaces the space's range
        fixed.pop("min_length", None), fixed.pop("max_length", None)
    fixed = apply_overrides(fixed, overrides)
    for key in fixed:
        problem = key_problem(key)
        if problem:
            raise MoglmError(f"--set {key}: {problem}")
    setup = ReverseCopySetup(space, space_name, "reverse-copy", fixed, dict(space.trial), Path(study_dir),
                             device=device)
    _, cfg = setup.configs(setup.representative_values())
    tokens = max_tokens or space.budget.max_tokens
    if tokens:
        low, high = cfg.lengths
        setup.trial_overrides["steps"] = max(1, math.ceil(tokens / (cfg.batch_size * (low + high) / 2)))
    setup.study_dir.mkdir(parents=True, exist_ok=True)
    record = setup.study_dir / "fixed.json"
    settings = plain({"fixed": fixed, "trial": setup.trial_overrides})
    if record.is_file():
        diff = first_difference(json.loads(record.read_text()), settings)
        if diff:
            raise MoglmError(f"{setup.study_dir} holds a reverse-copy study with other settings ({diff}); "
                             "use another study directory")
    else:
        atomic_write_text(record, json.dumps(settings, indent=1))
    return setup


class ReverseCopyObjective(Objective):
    """One trial: a reverse-copy run with the sampled settings; its best validation cross-entropy."""

    def _run(self, trial: optuna.Trial) -> float:
        setup = self.setup
        run_dir = self.trial_run_dir(trial)
        values = {name: spec.suggest(trial, name) for name, spec in setup.space.params.items()}
        ready, cfg = setup.configs(values)
        trial.set_user_attr("config", ready)
        start = time.monotonic()
        with self.trial_training(trial, run_dir, f"trial {trial.number}: {json.dumps(values)}") as (log, report):
            results = run_reverse_copy(cfg, run_dir, self.progress, log, device=setup.device, splits=("valid",),
                                       on_evaluation=report)
        valid = results["splits"]["valid"]
        trial.set_user_attr("level", "reverse-copy")  # how the report words the score
        trial.set_user_attr("valid", {k: v for k, v in valid.items() if k != "by_length"})
        trial.set_user_attr("hidden_size", results["hidden_size"])
        trial.set_user_attr("num_params", results["num_params"])
        trial.set_user_attr("steps", cfg.steps)
        trial.set_user_attr("seconds", round(time.monotonic() - start, 1))
        return float(valid["xent"])


def best_settings_text(study: optuna.Study, best: optuna.trial.FrozenTrial, storage: str) -> str:
    """The best trial's reverse-copy settings as TOML, with provenance and the command that trains them."""
    import tomli_w

    settings = plain(best.user_attrs["config"])
    names = {"input_embedding_ratio": "embedding-ratio"}  # moglm task reverse-copy's option when named otherwise
    flags = " ".join(f"--{names.get(k, k.replace('_', '-'))} {v}" for k, v in settings.items()
                     if not isinstance(v, dict))
    cell = " ".join(f"--cell {k}={v}" for k, v in settings.get("cell", {}).items())
    lines = [f"# moglm tune: the best reverse-copy settings of Optuna study {study.study_name!r}",
             f"# storage: {storage}",
             f"# trial {best.number}: valid xent {best.value:.4f} nats per decoded token, "
             f"{best.user_attrs.get('num_params', 0):,} parameters (hidden {best.user_attrs.get('hidden_size')})",
             f"# tuned: {', '.join(f'{k} = {v:.4g}' if isinstance(v, float) else f'{k} = {v}' for k, v in best.params.items())}",
             f"# train: moglm task reverse-copy {flags} {cell}".rstrip()]
    return "\n".join(lines) + "\n\n" + tomli_w.dumps(settings)


def tune_reverse_copy(space: str | Path, study_dir: str | Path, fixed: dict[str, Any] | None = None,
                      trials: int | None = None, workers: int = 1, log: Callable[[str], None] = print,
                      **options: Any) -> dict[str, Any]:
    """Run (or resume) the reverse-copy study of ``space`` (a file or a shipped name, e.g.
    ``reverse-copy-mogrifier``) in ``study_dir`` and return the best trial's parameters, e.g.
    ``{"learning_rate": 0.002, "l2_penalty": 1e-5}``.

    ``fixed`` holds :class:`ReverseCopyConfig` fields that replace the space's ``[fixed]`` ones (a ``cell``
    mapping replaces the space's cell options whole); ``trials`` is the study's total (rerunning adds none);
    ``options`` go to :func:`moglm.tune.run_study` (``timeout``, ``threads``, ``seed``, ``storage``, ...).
    The best trial's full settings are ``best_trial(result.study).user_attrs["config"]``."""
    from .search_space import load_space
    from .study import best_trial, run_study

    if load_space(space)[0].target != "reverse-copy":
        raise MoglmError(f"{space}: not a reverse-copy search space (target {load_space(space)[0].target!r})")
    overrides = [f"{key}={json.dumps(value)}" for key, value in (fixed or {}).items()]
    result = run_study(space, study_dir=study_dir, overrides=overrides, trials=trials, workers=workers, log=log,
                       **options)
    best = best_trial(result.study)
    if best is None:
        raise MoglmError(f"study in {study_dir}: no trial completed (see its trials' tune.log)")
    return dict(best.params)
