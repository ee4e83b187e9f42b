"""Optimisers for dynamic evaluation (Krause thesis, section 5.4, eq. 5.10-5.12, tables 5.3-5.7): the
``optimisers`` evaluation of a trained run, written to ``evaluations/optimisers.json``.

The thesis asks whether what helps training also helps dynamic evaluation, and why its own rule (global
RMS with an RMS decay prior, eq. 4.7) works better than the deep-learning optimisers. Each row below
dynamically evaluates the same prefix of the validation split (``scale.eval_tokens`` tokens) with one
optimiser, its learning rate tuned for that row alone ("tuned separately for each", 5.4.1-5.4.2: a
hill-climb on the rule's lr grid of :mod:`moglm.dynamic_evaluation.search`, then one step of sqrt(3)
either way; at most ``scale.tune_trials`` settings per row, a cap only the smoke scale reaches), and the
best setting then scores the same number of test tokens:

* static evaluation;
* SGD, and SGD with momentum mu = 0.5 and 0.9 (5.4.1, table 5.3: momentum always hurt; rule ``sgd-momentum``);
* RMSprop as in deep learning frameworks: alpha 0.99, eps 1e-8 (5.4.2, table 5.4: worse than plain SGD);
* the hybrid of RMSprop and SGD (5.4.3, table 5.5): RMSprop with eps hill-climbed on 1e-8..1 (a large eps
  makes it SGD at lr / eps), the lr tuned for every eps; slightly better than SGD in the thesis;
* global RMS without a decay prior (5.4.3), with statistics from 1% of the training split (eq. 4.4); and
  with 0.1% and 10% (5.4.4.1, table 5.6: the amount of data hardly matters);
* non-local RMSprop (5.4.4.2, table 5.7): RMSprop with the hybrid's eps whose running mean square is fed by
  the gradients of a second stream, the training split read in parallel in segments of the same length
  with its own carried state, under the current adapted weights; those gradients never move the weights.
  It is the local RMSprop row (the hybrid) with only the source of the statistics changed: the thesis
  found it on par with global RMS, so local statistics are what hurts RMSprop (they damp the updates of
  words that recur in the text, which dynamic evaluation needs most);
* table 4.1's progression, with the SGD and global RMS rows above: SGD with a decay prior (``sgd-decay``,
  eq. 4.3) and global RMS with a decay prior (``rms-decay``, eq. 4.5), then global RMS with the RMS decay
  prior (``rms-rmsdecay``, eq. 4.7), the thesis's final rule; lr tuned with the default decay and eps.

Segments are ``Hyperparameters().segment_length`` tokens for every row; the divergence guard of
:mod:`moglm.dynamic_evaluation.evaluate` is on (its rollbacks are counted per row). The global statistics
are the run's cached ones (``dyneval/rms-<key>.safetensors``, batch 8 x 70). Scores: cross-entropy in
nats per token and the unit's score, perplexity for word-level corpora and bits per character
otherwise. The report (:mod:`moglm.report.optimisers`) tabulates the rows and says, for each claim of the
thesis, whether it reproduces.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..device import resolve_device
from ..dynamic_evaluation.evaluate import DynamicResult, dynamic_evaluate, nonlocal_rmsprop, static_pass
from ..dynamic_evaluation.search import GRIDS, coordinate_search, grid_for
from ..dynamic_evaluation.statistics import StatisticsSettings
from ..dynamic_evaluation.update_rules import DEFAULT_LR, Hyperparameters, lr_family
from ..errors import MoglmError
from ..evaluation.scores import Scores
from ..evaluation.stream_model import static_window
from .spec import Scale

#: the hybrid's eps grid (thesis table 5.5's range) and where its hill-climb starts (the thesis's best)
EPS_GRID = GRIDS["eps_rmsprop"]
EPS_START = 1e-2
#: the refinement after the hill-climb on a grid of ~3x steps
REFINE = math.sqrt(3.0)


@dataclass(frozen=True)
class Row:
    """One optimiser of the comparison. ``rule`` None: static evaluation; ``settings``: fixed hyperparameters;
    ``fraction``: of the training split behind the global statistics (``rms*`` rules); ``tune_eps``: the
    hybrid; ``nonlocal_statistics``: RMSprop fed by a training stream (its eps is the hybrid's)."""

    name: str
    label: str
    section: str
    rule: str | None = None
    settings: dict[str, float] = field(default_factory=dict)
    fraction: float | None = None
    tune_eps: bool = False
    nonlocal_statistics: bool = False


ROWS = (
    Row("static", "static", "", None),
    Row("sgd", "SGD", "5.4.1", "sgd"),
    Row("momentum-0.5", "SGD + momentum 0.5", "5.4.1", "sgd-momentum", {"momentum": 0.5}),
    Row("momentum-0.9", "SGD + momentum 0.9", "5.4.1", "sgd-momentum", {"momentum": 0.9}),
    Row("rmsprop", "RMSprop, eps 1e-8 (deep learning frameworks)", "5.4.2", "rmsprop", {"alpha": 0.99, "eps": 1e-8}),
    Row("hybrid", "RMSprop, eps tuned (hybrid with SGD)", "5.4.3", "rmsprop", {"alpha": 0.99}, tune_eps=True),
    Row("global-rms", "global RMS, 1% of training data", "5.4.3", "rms", fraction=0.01),
    Row("global-rms-0.001", "global RMS, 0.1% of training data", "5.4.4.1", "rms", fraction=0.001),
    Row("global-rms-0.1", "global RMS, 10% of training data", "5.4.4.1", "rms", fraction=0.1),
    Row("nonlocal-rmsprop", "non-local RMSprop (statistics of training text)", "5.4.4.2", "rmsprop",
        {"alpha": 0.99}, nonlocal_statistics=True),
    Row("sgd-decay", "SGD + decay (thesis eq. 4.3; table 4.1)", "4.5", "sgd-decay"),
    Row("global-rms-decay", "global RMS + decay (thesis eq. 4.5; table 4.1)", "4.5", "rms-decay", fraction=0.01),
    Row("global-rms-rmsdecay", "global RMS + RMS decay (thesis eq. 4.7)", "4.5", "rms-rmsdecay", fraction=0.01),
)


def tune_lr(score: Callable[[Hyperparameters], float], start: Hyperparameters,
            max_trials: int | None = None) -> tuple[Hyperparameters, float, list[dict]]:
    """The best lr for ``start``'s other settings: a hill-climb on the rule's lr grid from the grid point
    nearest ``start.lr`` (:func:`~moglm.dynamic_evaluation.search.coordinate_search`), then one step of
    :data:`REFINE` up and, if that does not help, down; at most ``max_trials`` settings are scored (the
    search stops there). Returns the best setting, its score and every trial."""
    seen: dict[float, float] = {}

    def objective(hp: Hyperparameters) -> tuple[float, dict]:
        if hp.lr not in seen:
            if max_trials is not None and len(seen) >= max_trials:
                return math.inf, {}  # out of trials: no step looks better
            seen[hp.lr] = score(hp)
        return seen[hp.lr], {"xent": seen[hp.lr]}

    grid = grid_for("lr", start)
    start = start.with_(lr=min(grid, key=lambda v: abs(math.log(v / start.lr))))
    best, _ = coordinate_search(objective, start, ("lr",), log=lambda s: None)
    for factor in (REFINE, 1 / REFINE):
        candidate = best.with_(lr=best.lr * factor)
        if objective(candidate)[0] < seen[best.lr]:
            best = candidate
            break
    trials = [{"lr": lr, "xent": xent} for lr, xent in seen.items()]
    return best, seen[best.lr], trials


def _unit_scores(scores: Scores, level: str) -> dict[str, Any]:
    d = scores.as_dict()
    d["score"] = d["perplexity"] if level == "word" else d["bits_per_token"]
    return d


def compare_optimisers(run, scale: Scale, progress: bool, log: Callable[[str], None],
                       segment_length: int | None = None) -> dict[str, Any]:
    """Every row of :data:`ROWS` for ``run`` (a :class:`~moglm.runs.language_model.LanguageModelRun`,
    its best checkpoint and softmax temperature) on the first ``scale.eval_tokens`` tokens of valid
    (tuning) and test (scoring), or the whole splits; the report of ``evaluations/optimisers.json``."""
    from ..dynamic_evaluation.run import load_corpus_for, run_statistics
    from ..evaluation.scores import unit

    started = time.time()
    cfg = run.load_config()
    model, _, _ = run.load_model("best", resolve_device(cfg.train.device))
    corpus = load_corpus_for(run, "the optimisers comparison")
    level = corpus.format
    static_json = run.path / "evaluations" / "static.json"
    factor = float(json.loads(static_json.read_text()).get("temperature", 1.0)) if static_json.is_file() else 1.0
    base = Hyperparameters() if segment_length is None else Hyperparameters(segment_length=segment_length)
    n = base.segment_length
    tokens = scale.eval_tokens
    prefix = {split: corpus[split] if tokens is None else corpus[split][: tokens + 1] for split in ("valid", "test")}
    if any(len(ids) < 2 for ids in prefix.values()):
        raise MoglmError(f"{run.path}: the optimisers comparison needs validation and test tokens")
    train = corpus["train"]
    statics = {split: static_pass(model, ids, 1, static_window(model, cfg.train.bptt, n), factor)
               for split, ids in prefix.items()}
    rms_by_fraction: dict[float, Any] = {}

    def read_fraction(fraction: float) -> float:  # the scale's stats_tokens caps every row's statistics
        return fraction if scale.stats_tokens is None else min(fraction, scale.stats_tokens / len(train))

    def statistics(fraction: float):
        if fraction not in rms_by_fraction:
            rms_by_fraction[fraction] = run_statistics(run, "best", model, train, None,
                                                       StatisticsSettings(fraction=read_fraction(fraction)),
                                                       progress, log)
        return rms_by_fraction[fraction]

    def evaluate(row: Row, hp: Hyperparameters, split: str) -> DynamicResult:
        if row.nonlocal_statistics:
            return nonlocal_rmsprop(model, prefix[split], hp, train, statics[split], factor)
        rms = statistics(row.fraction) if row.fraction is not None else None
        return dynamic_evaluate(model, prefix[split], hp, rms, static=statics[split], factor=factor)

    rows: list[dict[str, Any]] = []
    best_lr: dict[str, float] = {}
    hybrid_eps = EPS_START
    for row in ROWS:
        out: dict[str, Any] = {"name": row.name, "label": row.label, "section": row.section, "rule": row.rule,
                               "statistics_fraction": row.fraction}
        if row.fraction is not None and read_fraction(row.fraction) < row.fraction:
            out["statistics_read"] = read_fraction(row.fraction)  # capped by the scale's stats_tokens
        if row.rule is None:
            out |= {"settings": None, "lr": None,
                    **{split: _unit_scores(statics[split].scores, level) for split in statics}}
            rows.append(out)
            continue
        settings = dict(row.settings) | ({"eps": hybrid_eps} if row.nonlocal_statistics else {})
        hp = base.with_(rule=row.rule, lr=_start_lr(row, best_lr), **settings)
        if row.fraction is not None:
            try:
                statistics(row.fraction)
            except MoglmError as e:  # too little training text for this fraction (tiny corpora)
                rows.append(out | {"settings": hp.as_dict(), "lr": None, "skipped": str(e)})
                log(f"{row.label}: skipped ({e})")
                continue

        passes: dict[Hyperparameters, DynamicResult] = {}

        def score(candidate: Hyperparameters) -> float:
            passes[candidate] = evaluate(row, candidate, "valid")
            return passes[candidate].scores.xent

        if row.tune_eps:
            hp, _, trials = _tune_eps_and_lr(score, hp, scale.tune_trials)
            hybrid_eps = hp.eps
        else:
            hp, _, trials = tune_lr(score, hp, scale.tune_trials)
        best_lr[row.name] = hp.lr
        valid, test = passes[hp], evaluate(row, hp, "test")
        out |= {"settings": hp.as_dict(), "lr": hp.lr, "valid": _unit_scores(valid.scores, level),
                "test": _unit_scores(test.scores, level), "rollbacks": {"valid": valid.rollbacks,
                                                                        "test": test.rollbacks},
                "trials": trials}
        rows.append(out)
        log(f"{row.label}: {hp.label()}; valid {valid.scores.headline(level)}, test {test.scores.headline(level)}"
            f" ({len(trials)} settings tried)")
    return {"level": level, "temperature": factor, "segment_length": n, "tokens": tokens,
            "static": {split: _unit_scores(p.scores, level) for split, p in statics.items()},
            "unit": unit(level), "rows": rows,
            "seconds": time.time() - started}


def _start_lr(row: Row, best_lr: dict[str, float]) -> float:
    """Where a row's lr search starts: momentum mu multiplies SGD's step by about 1 / (1 - mu), so SGD's best
    lr times (1 - mu); non-local RMSprop at the hybrid's; else the rule's default."""
    if row.rule == "sgd-momentum" and "sgd" in best_lr:
        return best_lr["sgd"] * (1 - row.settings["momentum"])
    if row.nonlocal_statistics and "hybrid" in best_lr:
        return best_lr["hybrid"]
    return DEFAULT_LR[lr_family(row.rule)]


def _tune_eps_and_lr(score: Callable[[Hyperparameters], float], start: Hyperparameters,
                     max_trials: int | None = None) -> tuple[Hyperparameters, float, list[dict]]:
    """The hybrid (thesis 5.4.3): a hill-climb over :data:`EPS_GRID` from :data:`EPS_START`, the lr tuned
    for each eps (from the previous eps's best; at most ``max_trials`` eps values, and lr values per eps);
    returns the best setting, its score and every trial."""
    results: dict[float, tuple[Hyperparameters, float]] = {}
    trials: list[dict] = []

    def at(i: int, lr: float) -> float:
        eps = EPS_GRID[i]
        if eps not in results:
            if max_trials is not None and len(results) >= max_trials:
                return math.inf
            best, xent, tried = tune_lr(score, start.with_(eps=eps, lr=lr), max_trials)
            results[eps] = (best, xent)
            trials.extend({"eps": eps, **t} for t in tried)
        return results[eps][1]

    i0 = EPS_GRID.index(EPS_START)
    at(i0, start.lr)
    best_i = i0
    for direction in (1, -1):
        i, moved = i0 + direction, False
        while 0 <= i < len(EPS_GRID) and at(i, results[EPS_GRID[best_i]][0].lr) < results[EPS_GRID[best_i]][1]:
            best_i, moved, i = i, True, i + direction
        if moved:
            break
    best, xent = results[EPS_GRID[best_i]]
    return best, xent, trials
