"""Tuning dynamic evaluation (search spaces with ``target = "dyneval"``, the paper's table 6).

The base is a trained run directory. Every trial dynamically evaluates the run's best checkpoint
(:func:`moglm.dynamic_evaluation.dynamic_evaluate`, one stream, the run's softmax temperature) on the
first ``budget.max_tokens`` validation tokens (10,000 by default, as ``moglm dyneval --search``) with
the sampled settings; the objective is that cross-entropy. Keys are ``dyneval.<setting>``:
``rule``, ``lr``, ``decay``, ``eps`` and ``segment_length`` (:class:`moglm.dynamic_evaluation.Hyperparameters`),
and, for the RMS statistics, ``stats_fraction`` and ``stats_batch_size``. The statistics are
collected once, before any trial, and cached in the run directory. The best trial is written as
``best_dyneval.toml`` with the ``moglm dyneval`` command that applies it to the test split.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from ..dynamic_evaluation import Hyperparameters, StatisticsSettings, dynamic_evaluate, static_pass
from ..dynamic_evaluation.run import load_corpus_for, run_statistics
from ..errors import MoglmError
from ..runs.language_model import LanguageModelRun
from ..device import resolve_device
from .search_space import SearchSpace

SETTINGS = tuple(f.name for f in dataclasses.fields(Hyperparameters))
STATISTICS = {"stats_fraction": "fraction", "stats_batch_size": "batch_size"}
DEFAULT_TOKENS = 10_000


@dataclass
class DynevalSetup:
    """What a dynamic-evaluation trial needs; picklable for worker processes."""

    space: SearchSpace
    space_name: str
    base_name: str
    run_dir: Path
    fixed: dict[str, Any]
    tokens: int
    study_dir: Path
    trial_overrides: dict[str, Any] = dataclasses.field(default_factory=dict)

    def objective(self) -> "DynevalObjective":
        return DynevalObjective(self)

    def pruning_warmup_steps(self) -> tuple[int, int, int]:
        return 0, 1, 1  # one evaluation per trial: nothing to prune

    def settings(self, values: dict[str, Any]) -> tuple[Hyperparameters, StatisticsSettings]:
        merged = {**self.fixed, **values}
        stats = {STATISTICS[k]: v for k, v in merged.items() if k in STATISTICS}
        return (Hyperparameters(**{k: v for k, v in merged.items() if k in SETTINGS}), StatisticsSettings(**stats))


def prepare_dyneval(space: SearchSpace, space_name: str, base: str | None, max_tokens: int | None,
                    study_dir: Path) -> DynevalSetup:
    """Check the keys and the run, and collect the RMS statistics once (workers then read the cache)."""
    if base is None:
        raise MoglmError(f"search space {space_name} tunes dynamic evaluation: --base RUN_DIR names the trained run")
    run = LanguageModelRun(base)
    run.load_config()  # a run directory, or a one-line error
    fixed: dict[str, Any] = {}
    for section, mapping in (("fixed", space.fixed), ("trial", space.trial), ("params", space.params)):
        for key, value in mapping.items():
            name = key.split(".", 1)[1]
            if name not in SETTINGS and name not in STATISTICS:
                raise MoglmError(f"{space_name}: {section}.{key}: not a dynamic-evaluation setting "
                                 f"(dyneval.{', dyneval.'.join(SETTINGS + tuple(STATISTICS))})")
            if section != "params":
                fixed[name] = value
    setup = DynevalSetup(space, space_name, Path(base).name, Path(base).resolve(), fixed,
                         max_tokens or space.budget.max_tokens or DEFAULT_TOKENS, Path(study_dir))
    representative = {k.split(".", 1)[1]: (p.choices[0] if p.choices is not None else
                                          (int(p.low) if p.integer else p.low)) for k, p in space.params.items()}
    setup.settings(representative)  # raises MoglmError for a bad rule or value
    setup.objective().load()
    return setup


class DynevalObjective:
    """One trial: dynamic evaluation of the validation prefix with the sampled settings."""

    interrupted = False

    def __init__(self, setup: DynevalSetup) -> None:
        self.setup = setup
        self._loaded: dict[str, Any] | None = None

    def load(self) -> dict[str, Any]:
        """The model, the validation prefix, its static pass, the temperature and the RMS statistics."""
        if self._loaded is None:
            run = LanguageModelRun(self.setup.run_dir)
            cfg = run.load_config()
            model, _, _ = run.load_model("best", resolve_device(cfg.train.device))
            corpus = load_corpus_for(run, "dynamic evaluation")
            prefix = corpus["valid"][: self.setup.tokens + 1]
            factor = 1.0
            if run.results_path.is_file():
                factor = float(json.loads(run.results_path.read_text()).get("temperature", 1.0))
            _, stats = self.setup.settings({})
            rms = run_statistics(run, "best", model, corpus["train"], None, stats, progress=False, log=lambda s: None)
            self._loaded = dict(model=model, prefix=prefix, factor=factor, rms=rms, level=corpus.format,
                                static=static_pass(model, prefix, 1, cfg.train.bptt, factor))
        return self._loaded

    def __call__(self, trial: optuna.Trial) -> float:
        try:
            values = {k.split(".", 1)[1]: spec.suggest(trial, k) for k, spec in self.setup.space.params.items()}
            hp, _ = self.setup.settings(values)
            trial.set_user_attr("config", {"dyneval": {**self.setup.fixed, **values}})
            d = self.load()
            start = time.monotonic()
            result = dynamic_evaluate(d["model"], d["prefix"], hp, d["rms"], static=d["static"], factor=d["factor"])
        except Exception as e:
            trial.set_user_attr("error", f"{type(e).__name__}: {e}"[:2000])
            raise
        trial.set_user_attr("level", d["level"])
        trial.set_user_attr("temperature", d["factor"])
        trial.set_user_attr("static_xent", result.static.xent)
        trial.set_user_attr("rollbacks", result.rollbacks)
        trial.set_user_attr("seconds", round(time.monotonic() - start, 1))
        return float(result.scores.xent)


def best_settings_text(study: optuna.Study, best: optuna.trial.FrozenTrial, setup: DynevalSetup,
                       storage: str) -> str:
    """The best settings as TOML, with provenance and the ``moglm dyneval`` command that applies them."""
    import tomli_w

    settings = best.user_attrs["config"]["dyneval"]
    hp, _ = setup.settings(settings)
    options = {"lr": "learning-rate"}  # moglm dyneval's option for each setting that is named otherwise
    flags = " ".join(f"--{options.get(k, k.replace('_', '-'))} {v}" for k, v in settings.items() if k != "rule")
    lines = [f"# moglm tune: the best dynamic-evaluation settings of Optuna study {study.study_name!r}",
             f"# storage: {storage}",
             f"# run {setup.run_dir}, first {setup.tokens:,} validation tokens: trial {best.number}, "
             f"dynamic xent {best.value:.4f} (static {best.user_attrs.get('static_xent', float('nan')):.4f}), "
             f"{best.user_attrs.get('rollbacks', 0)} rollbacks",
             f"# apply: moglm dyneval {setup.run_dir} --rule {hp.rule} {flags}"]
    return "\n".join(lines) + "\n\n" + tomli_w.dumps({"dyneval": settings})
