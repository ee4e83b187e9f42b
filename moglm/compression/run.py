"""Dynamic evaluation while coding, for a run directory: the settings a compressed file records and the
adapter they rebuild on either side (the same code for ``moglm compress``, ``decompress`` and the benchmark).

``--from-scratch SEED`` codes with the run's architecture and vocabulary but freshly initialised weights,
learning the file while coding it as NNCP does: the seed goes in the header, so the decoder draws the same
weights (and checks them against the header's digest) and replays the same updates."""

from __future__ import annotations

from pathlib import Path

from ..errors import MoglmError


#: ``moglm compress --dynamic``'s learning rate and decay (rule rms-rmsdecay, segments of 20) where the run has
#: no dynamic-evaluation settings of its own, searched on held-out English (chapters 6-8 of the Vim user manual;
#: docs/guides/compression.md): decay 0 and segments of 20 for a 400-step WikiText-2 byte model (lr 3e-4 .. 1e-2,
#: decay 0 .. 1e-2, segments 10 .. 40), then the step for the shipped ``wikitext-2-byte-mogrifier-cpu`` trained
#: to its 3000 steps (lr 2e-3 .. 1.5e-2 at decay 0, segments of 20). Text unlike the training data wants 5x
#: dynamic evaluation's default step and no pull back towards the trained weights.
COMPRESSION_LR = 5e-3
COMPRESSION_DECAY = 0.0


def dynamic_settings(run_dir: Path, rule: str | None = None, lr: float | None = None) -> dict:
    """The settings of ``moglm compress --dynamic``: the run's ``dyneval/full.json`` when a previous
    ``moglm dyneval`` wrote one, else rms-rmsdecay at :data:`COMPRESSION_LR` and :data:`COMPRESSION_DECAY`;
    ``rule`` (with its own defaults) and ``lr`` override."""
    from ..dynamic_evaluation import Hyperparameters, StatisticsSettings
    from ..dynamic_evaluation.run import saved_settings
    from ..runs.language_model import LanguageModelRun

    hp, statistics = saved_settings(LanguageModelRun(run_dir)) or (
        Hyperparameters(lr=COMPRESSION_LR, decay=COMPRESSION_DECAY), StatisticsSettings())
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


#: ``--from-scratch``'s rule unless one is given: RMSprop's running mean square needs no training statistics,
#: and it has no decay pulling the weights back to random ones
SCRATCH_RULE = "rmsprop"
#: and its learning rate: the best of 1e-3 .. 3e-2 coding held-out English from fresh weights (3e-2 diverged;
#: docs/guides/compression.md), 100x the rule's default for trained weights, which are close to good ones
SCRATCH_LR = 1e-2


def scratch_settings(seed: int, rule: str | None = None, lr: float | None = None) -> dict:
    """The settings of ``moglm compress --from-scratch SEED`` (recorded in the header, ``from_scratch``:
    the seed): :data:`SCRATCH_RULE` at :data:`SCRATCH_LR` unless ``rule`` / ``lr`` are given; the run's own
    dynamic-evaluation settings are for its trained weights and are not read."""
    from ..dynamic_evaluation import Hyperparameters, StatisticsSettings
    from ..dynamic_evaluation.update_rules import uses_rms

    if rule is not None and uses_rms(rule):
        raise MoglmError(f"--from-scratch learns without training statistics, which --rule {rule} divides by: "
                         "use rmsprop, sgd or sgd-momentum")
    chosen = rule or SCRATCH_RULE
    hp = Hyperparameters(rule=chosen, lr=lr if lr is not None else SCRATCH_LR if chosen == SCRATCH_RULE else None)
    return {"hyperparameters": hp.as_dict(), "statistics": vars(StatisticsSettings()), "from_scratch": seed}


def coding_model(run_dir: Path, checkpoint: str, seed: int | None):
    """``(model, vocab, logit factor)`` that codes a file: the run's checkpoint, or with ``seed`` the run's
    architecture initialised afresh (factor 1)."""
    from ..runs.language_model import LanguageModelRun, load_run

    if seed is None:
        run = load_run(run_dir, checkpoint, "cpu")
        return run.model, run.vocab, run.temperature
    model, vocab = LanguageModelRun(run_dir).fresh_model(seed)
    return model, vocab, 1.0
