"""Dynamic evaluation while coding, for a run directory: the settings a compressed file records and the
adapter they rebuild on either side (the same code for ``moglm compress``, ``decompress`` and the benchmark)."""

from __future__ import annotations

from pathlib import Path

from ..errors import MoglmError


def dynamic_settings(run_dir: Path, rule: str | None = None, lr: float | None = None) -> dict:
    """The settings of ``moglm compress --dynamic``: the run's ``dyneval/full.json`` when a previous
    ``moglm dyneval`` wrote one, else the defaults; ``rule`` (with its own defaults) and ``lr`` override."""
    from ..dynamic_evaluation import Hyperparameters, StatisticsSettings
    from ..dynamic_evaluation.run import saved_settings
    from ..runs.language_model import LanguageModelRun

    hp, statistics = saved_settings(LanguageModelRun(run_dir)) or (Hyperparameters(), StatisticsSettings())
    if rule is not None and rule != hp.rule:
        hp = Hyperparameters(rule=rule, segment_length=hp.segment_length)
    if lr is not None:
        hp = hp.with_(lr=lr)
    return {"hyperparameters": hp.as_dict(), "statistics": vars(statistics)}


def adapter_from_settings(run_dir: Path, model, checkpoint: str, factor: float, settings: dict):
    """The :class:`~moglm.dynamic_evaluation.DynamicEvaluator` that ``settings`` describe, on ``model`` (its RMS
    statistics from the run's cache in ``dyneval/``, else collected from its training data)."""
    from ..dynamic_evaluation import Hyperparameters, StatisticsSettings
    from ..dynamic_evaluation.run import run_adapter
    from ..runs.language_model import LanguageModelRun

    try:
        hp = Hyperparameters(**settings["hyperparameters"])
        statistics = StatisticsSettings(**settings["statistics"])
    except (KeyError, TypeError) as e:
        raise MoglmError(f"unreadable dynamic-evaluation settings ({e})") from None
    return run_adapter(LanguageModelRun(run_dir), model, hp, statistics, checkpoint, factor,
                       purpose="compression with dynamic evaluation")
