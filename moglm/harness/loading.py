"""A run directory as a :class:`~moglm.harness.scorer.RunScorer` for lm-eval's ``moglm`` model type: its checkpoint on
the device asked for, the logit factor ``moglm evaluate`` found, and with ``dynamic=true`` the dynamic-evaluation
settings (those given, as ``moglm dyneval`` takes them, else those of the run's ``dyneval/full.json``, else the
defaults) with the global RMS statistics the rms rules need (cached in the run's ``dyneval/``)."""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..device import resolve_device
from ..dynamic_evaluation import Hyperparameters, StatisticsSettings
from ..dynamic_evaluation.evaluate import DEFAULT_MARGIN
from ..dynamic_evaluation.run import rule_statistics, saved_settings
from ..runs.language_model import LanguageModelRun
from .scorer import Adaptation, RunScorer
from .settings import HarnessSettings


def load_scorer(settings: HarnessSettings, harness_device: str | None = None,
                log: Callable[[str], None] = print) -> tuple[RunScorer, dict[str, Any]]:
    """The scorer of ``settings.run`` and what it resolved (device, logit factor, dynamic settings) for the
    results' record. ``harness_device``: lm-eval's ``--device`` (default ``cuda:0``), used when ``settings``
    names none, and read as the CPU where CUDA is absent (as lm-eval's ``hf`` model does). ``log`` gets the notes
    (that fallback, statistics being collected)."""
    run = LanguageModelRun(settings.run)
    cfg = run.load_config()
    device = _device(settings.device, harness_device, cfg.train.device, log)
    model, cfg, vocab = run.load_model(settings.checkpoint, device)
    model.eval()
    factor = settings.logit_factor if settings.logit_factor is not None else run.logit_factor()
    resolved: dict[str, Any] = {"device": str(device), "logit_factor": factor, "level": vocab.level,
                                "bptt": cfg.train.bptt, "checkpoint": settings.checkpoint, "dynamic": None}
    if cfg.data.episodic:
        log(f"{run.path} was trained on episodes (data.episodic); lm-eval's documents are read as streams, the state "
            "carried across each")
    adaptation = None
    if settings.dynamic:
        saved = saved_settings(run)
        hp = (Hyperparameters(**settings.hyperparameters) if settings.hyperparameters or saved is None
              else saved[0])
        statistics = (StatisticsSettings(**settings.statistics) if settings.statistics or saved is None
                      else saved[1])
        margin = DEFAULT_MARGIN if settings.margin is None else settings.margin
        rms = rule_statistics(run, model, hp, statistics, settings.checkpoint, "dynamic evaluation with an rms rule",
                              log)
        adaptation = Adaptation(hp, rms, margin)
        source = "model_args" if settings.hyperparameters else "defaults" if saved is None else "dyneval/full.json"
        resolved["dynamic"] = {"hyperparameters": hp.as_dict(), "statistics": vars(statistics) if rms else None,
                               "margin": margin, "from": source}
    return RunScorer(model, vocab, factor, cfg.train.bptt, adaptation), resolved


def _device(asked: str | None, harness: str | None, run_default: str, log: Callable[[str], None]) -> torch.device:
    """``asked`` (model_args) strictly; else lm-eval's ``--device``, the CPU where it names CUDA and there is
    none; else the run's ``train.device``."""
    if asked is not None:
        return resolve_device(str(asked))
    if harness is not None:
        if str(harness).startswith("cuda") and not torch.cuda.is_available():
            log(f"--device {harness}: CUDA is not available, the run is read on the CPU")
            return torch.device("cpu")
        return resolve_device(str(harness))
    return resolve_device(run_default)
