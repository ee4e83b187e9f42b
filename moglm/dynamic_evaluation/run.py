"""Dynamic evaluation of a trained run (``moglm dyneval``): statistics, search, splits, report.

Files written to the run directory::

    dyneval/rms-<key>.safetensors     global RMS statistics (keyed by checkpoint and settings)
    dyneval/<tag>.json                settings, search trials, static vs dynamic scores, timings,
                                      rollbacks and the loss-by-position profile of every split
    dyneval/<tag>-<split>.png         the loss-by-position plot (thesis figure 5.2)

``<tag>`` is ``full`` or ``sparse``, with ``-episodic`` in episodic mode. ``moglm sample --adapt``
reads the settings of ``dyneval/full.json`` when it exists.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any, Callable

import numpy as np

from ..errors import MoglmError
from ..runs.build import load_data
from ..progress import above_bars
from ..provenance import write_result
from ..recurrence import cuda_graphs as graphs
from ..runs.language_model import LanguageModelRun
from ..device import resolve_device
from .. import distributed
from .across_processes import evaluate_streams
from .analysis import plot_profile, position_profile
from ..evaluation.stream_model import static_window
from .adapted import ALL, ParameterSelection
from .evaluate import DEFAULT_MARGIN, DynamicEvaluator, DynamicResult, dynamic_evaluate, static_pass
from .search import ORDER, ORDER_WITH_BUDGET, coordinate_search
from .sparse import SparseSpec
from .with_cache import CACHE_SIZE, CacheReport, mixed_scores, stream_targets, tune
from .statistics import StatisticsSettings, cache_key, gradient_rms, load_or_collect
from .update_rules import Hyperparameters, uses_rms


def load_corpus_for(run: LanguageModelRun, purpose: str):
    """The run's corpus, or a one-line error saying what it was needed for."""
    cfg = run.load_config()
    try:
        return load_data(cfg.data)
    except MoglmError as e:
        raise MoglmError(f"{run.path}: {purpose} needs the run's training data, which cannot be read: {e}") from None


def run_statistics(run: LanguageModelRun, which: str, model, train_ids: np.ndarray, sparse: SparseSpec | None,
                   settings: StatisticsSettings, progress: bool = True, log: Callable[[str], None] = print,
                   selection: ParameterSelection = ALL):
    """Global RMS statistics of a run's checkpoint (of the parameters ``selection`` names, or the sparse
    matrices), from the cache in ``dyneval/`` or collected."""
    pointer = run.checkpoints.pointer(which)
    if pointer is None:
        raise MoglmError(f"{run.path}: no {which} checkpoint yet")
    if len(train_ids) == 0:
        raise MoglmError(f"{run.path}: the training split is empty; RMS statistics need training data")
    checkpoint = {"dir": pointer["dir"], "weights": pointer.get("weights", "model")}
    spec = None if sparse is None else sparse.as_dict(model)
    path = run.path / "dyneval" / f"rms-{cache_key(checkpoint, settings, spec, selection)}.safetensors"
    names = selection.names(model) if sparse is None else sparse.names(model)
    metadata = {"checkpoint": checkpoint, "fraction": settings.fraction, "batch_size": settings.batch_size,
                "bptt": settings.bptt, "sparse": spec, "selection": selection.as_dict()}
    return load_or_collect(path, names, lambda: gradient_rms(model, train_ids, settings, sparse, progress,
                                                             selection), metadata, log)


def saved_settings(run: LanguageModelRun, tag: str = "full") -> tuple[Hyperparameters, StatisticsSettings] | None:
    """The hyperparameters and statistics settings a previous ``moglm dyneval`` used
    (``dyneval/<tag>.json``), if any."""
    path = run.path / "dyneval" / f"{tag}.json"
    if not path.is_file():
        return None
    try:
        report = json.loads(path.read_text())
        return Hyperparameters(**report["hyperparameters"]), StatisticsSettings(**(report["statistics"] or {}))
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError, MoglmError) as e:
        raise MoglmError(f"{path}: damaged ({type(e).__name__}: {e}); delete it, or run `moglm dyneval "
                         f"{run.path}` to write it again") from None


def sampling_adapter(run: LanguageModelRun, model, which: str = "best", lr: float | None = None) -> DynamicEvaluator:
    """An adapter for ``moglm sample --adapt``: the settings of ``dyneval/full.json`` when a previous
    ``moglm dyneval`` wrote one, else the defaults; ``lr`` overrides the learning rate."""
    hp, statistics = saved_settings(run) or (Hyperparameters(), StatisticsSettings())
    if lr is not None:
        hp = hp.with_(lr=lr)
    return run_adapter(run, model, hp, statistics, which)


def run_adapter(run: LanguageModelRun, model, hp: Hyperparameters, statistics: StatisticsSettings,
                which: str = "best", factor: float = 1.0, purpose: str = "adapting while sampling") -> DynamicEvaluator:
    """A :class:`DynamicEvaluator` of a run's ``model`` with ``hp`` and, for the RMS rules, the run's global
    RMS statistics under ``statistics`` (:func:`rule_statistics`)."""
    return DynamicEvaluator(model, hp, rule_statistics(run, model, hp, statistics, which, purpose), factor=factor)


def rule_statistics(run: LanguageModelRun, model, hp: Hyperparameters, statistics: StatisticsSettings,
                    which: str = "best", purpose: str = "dynamic evaluation",
                    log: Callable[[str], None] = lambda m: print(m, file=sys.stderr)) -> dict | None:
    """The global RMS statistics of a run's checkpoint that ``hp``'s rule divides by (from the cache in
    ``dyneval/``, else collected from its training data), or ``None`` for a rule that needs none."""
    if not uses_rms(hp.rule):
        return None
    train = load_corpus_for(run, purpose)["train"]
    return run_statistics(run, which, model, train, None, statistics, False, log)


def dyneval_run(
    run: LanguageModelRun,
    splits: tuple[str, ...] = ("test",),
    hp: Hyperparameters = Hyperparameters(),
    search: bool = False,
    search_tokens: int = 10_000,
    max_cost: float | None = None,
    sparse: SparseSpec | None = None,
    streams: int = 1,
    episodic: bool | None = None,
    boundary: str | None = None,
    statistics: StatisticsSettings = StatisticsSettings(),
    eval_tokens: int | None = None,
    temperature: float | None = None,
    margin: float = DEFAULT_MARGIN,
    mc_samples: int = 0,
    selection: ParameterSelection = ALL,
    cache: bool = False,
    cache_size: int = CACHE_SIZE,
    on_result: Callable[[str, DynamicResult], None] | None = None,
    which: str = "best",
    device: str | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
    write: bool = True,
    cuda_graphs: bool | None = None,
) -> dict[str, Any]:
    """Dynamic evaluation of a run's checkpoint on ``splits`` (optionally after a search on the first
    ``search_tokens`` validation tokens, among settings that take at most ``max_cost`` times the CPU
    time of static evaluation; ``eval_tokens``: only the first that many tokens of each split); returns
    (and writes) the report. ``temperature=None``: the
    logit factor of the run's ``results.json`` (what ``moglm evaluate`` reported), else 1.
    ``episodic=None``: episodic when the run was trained on episodes (``data.episodic``). ``mc_samples``:
    MC dropout with dynamic evaluation, the dropout rates times the run's ``mc_dropout_multiplier``.
    ``selection``: which parameters adapt (full dynamic evaluation; :class:`~.adapted.ParameterSelection`).
    ``cache``: also score static + neural cache and dynamic + cache (:mod:`.with_cache`), theta and lambda
    searched on the first ``search_tokens`` validation tokens for each, with ``cache_size`` positions.
    ``on_result(split, result)``: receives each split's :class:`DynamicResult` (its per-token losses).
    ``cuda_graphs``: the recurrent windows as CUDA graphs as ``--cuda-graphs/--no-cuda-graphs`` say (``None``,
    auto: on a CUDA device, each process of a torchrun its own; :func:`moglm.recurrence.cuda_graphs.resolve`)."""
    for split in splits:
        if split not in ("train", "valid", "test"):
            raise MoglmError(f"split must be train, valid or test, got {split!r}")
    if streams < 1:
        raise MoglmError(f"streams must be >= 1, got {streams}")
    cfg = run.load_config()
    episodic = cfg.data.episodic if episodic is None else episodic
    if episodic and streams != 1:
        raise MoglmError("episodic dynamic evaluation reads one stream (streams must be 1)")
    group = distributed.process_group(resolve_device(device or cfg.train.device))  # torchrun: streams over ranks
    if not group.is_main:
        log, write, progress = (lambda message: None), False, False
    where = distributed.rank_device(resolve_device(device or cfg.train.device), group)
    model, _, vocab = run.load_model(which, where)
    with graphs.where_possible(cuda_graphs, where, above_bars(log), "--cuda-graphs"):
        corpus = load_corpus_for(run, "dynamic evaluation")
        factor = temperature if temperature is not None else run.logit_factor()
        boundary_id = None
        if episodic:
            if boundary is None:
                boundary_id = corpus.separator_id()
            elif boundary in vocab.stoi:
                boundary_id = vocab.stoi[boundary]
            else:
                raise MoglmError(f"boundary token {boundary!r} is not in the vocabulary")
            hp = hp.with_(decay=0.0)
            log("episodic: weights and state reset at every boundary, decay 0")
        rms = None
        if uses_rms(hp.rule):
            rms = group.on_main(lambda: run_statistics(run, which, model, corpus["train"], sparse, statistics, progress,
                                                       log, selection))
        report: dict[str, Any] = {
            "checkpoint": {"which": which, "step": run.checkpoints.pointer(which)["step"]},
            "mode": "sparse" if sparse else "full", "sparse": None if sparse is None else sparse.as_dict(model),
            "streams": streams, "episodic": episodic, "temperature": factor, "level": corpus.format,
            "statistics": None if rms is None else vars(statistics), "divergence_margin": margin, "search": None,
            "mc_dropout": {"samples": mc_samples, "multiplier": cfg.evaluation.mc_dropout_multiplier} if mc_samples else None,
            "selection": None if sparse else selection.as_dict(),
        }
        options = dict(sparse=sparse, streams=streams, boundary=boundary_id, factor=factor, margin=margin,
                       mc_samples=mc_samples, mc_multiplier=cfg.evaluation.mc_dropout_multiplier, selection=selection)
        if search:
            longest = 20 if corpus.format == "word" else 50  # Mogrifier paper appendix A
            hp, report["search"] = group.on_main(lambda: search_settings(model, corpus["valid"], hp, rms, search_tokens,
                                                                         max_cost, cfg.train.bptt, longest, options, log))
        report["hyperparameters"] = hp.as_dict()
        tuned_cache = None
        if cache:
            if episodic or group.distributed or mc_samples:
                raise MoglmError("the neural cache reads one stream in one process, without MC dropout")
            tuned_cache = _tune_cache(model, corpus["valid"], hp, rms, search_tokens, cfg.train.bptt, cache_size,
                                      options, log)
            report["cache"] = tuned_cache.as_dict()
        report["splits"] = {}
        tag = ("sparse" if sparse else "full") + ("-episodic" if episodic else "") + ("-mc" if mc_samples else "")
        if eval_tokens is not None:  # a short run never stands in for the full run (sample --adapt, compress read it)
            tag += f"-first{eval_tokens}"
        harmful: list[str] = []
        for split in splits:
            ids = corpus[split] if eval_tokens is None else corpus[split][: eval_tokens + streams]
            if episodic:
                result = dynamic_evaluate(model, ids, hp, rms, progress=progress, desc=split, **options)
            else:
                result = evaluate_streams(model, ids, hp, rms, bptt=static_window(model, cfg.train.bptt, hp.segment_length),
                                          text=corpus.text(split) if eval_tokens is None else None, progress=progress, desc=split, group=group,
                                          features=cache, **options)
            if on_result is not None:
                on_result(split, result)
            profile = position_profile(result.static_losses, result.losses, result.episodes)
            report["splits"][split] = result.as_dict() | {"profile": profile}
            if tuned_cache is not None:
                report["splits"][split]["cache"] = _cache_rows(result, ids, streams, tuned_cache, corpus.format, split,
                                                               log)
            log(f"{split}: static {result.static.headline(corpus.format)} -> "
                f"dynamic {result.scores.headline(corpus.format)}"
                f" (perplexity {-result.gain:+.1%}); {result.rollbacks} rollbacks; "
                f"{result.timing.seconds:.1f}s, {result.cost:.1f}x the static CPU time")
            if result.gain <= 0 or result.rollbacks:
                why = (f"scored worse than static ({result.static.headline(corpus.format)} -> "
                       f"{result.scores.headline(corpus.format)})" if result.gain <= 0 else
                       f"rolled back {result.rollbacks} time{'s' * (result.rollbacks > 1)} (diverging updates)")
                harmful.append(f"{split}: {why}")
                log(f"warning: dynamic evaluation {why} on {split} with {hp.label()}; search the settings on this "
                    "model (--search) or lower --learning-rate")
            if write:
                plot_profile(profile, run.path / "dyneval" / f"{tag}-{split}.png",
                             f"{run.path.name} {split}: {tag} dynamic evaluation")
        if write and harmful:
            tag += "-rejected"  # the settings the other commands read are left alone
            log(f"this report goes to dyneval/{tag}.json; the run's saved dynamic-evaluation settings are unchanged")
        report["harmful"] = harmful
        if write:
            path = run.path / "dyneval" / f"{tag}.json"
            write_result(path, report, None)
            log(f"report: {path}")
    return report


def _tune_cache(model, valid: np.ndarray, hp: Hyperparameters, rms, tokens: int, bptt: int, size: int,
                options: dict, log: Callable[[str], None]) -> CacheReport:
    """theta and lambda of the neural cache, for the static and for the adapted model, searched on the
    first ``tokens`` validation tokens (:mod:`.with_cache`)."""
    streams = options["streams"]
    prefix = valid[: tokens + streams]
    static = static_pass(model, prefix, streams, static_window(model, bptt, hp.segment_length), options["factor"],
                         features=True)
    adapted = dynamic_evaluate(model, prefix, hp, rms, static=static, features=True, **options)
    targets = stream_targets(prefix, streams, static.losses.shape[0])
    tuned = CacheReport(tune(static.losses, static.features, targets, size),
                        tune(adapted.losses, adapted.features, targets, size))
    for name, found in (("static", tuned.static), ("dynamic", tuned.dynamic)):
        log(f"neural cache for the {name} model: theta {found.best.theta:g}, lambda {found.best.lam:g}, size {size} "
            f"(validation xent {found.base_xent:.4f} -> {found.xent:.4f} on {len(prefix):,} tokens)")
    return tuned


def _cache_rows(result: DynamicResult, ids: np.ndarray, streams: int, tuned: CacheReport, level: str, split: str,
                log: Callable[[str], None]) -> dict:
    """Static + cache and dynamic + cache scores of one split's passes."""
    targets = stream_targets(ids, streams, result.losses.shape[0])
    static, _ = mixed_scores(result.static_losses, result.static_features, targets, tuned.static.best, result.static)
    dynamic, _ = mixed_scores(result.losses, result.features, targets, tuned.dynamic.best, result.scores)
    log(f"{split}: static + cache {static.headline(level)}; dynamic + cache {dynamic.headline(level)}")
    return {"static": static.as_dict(), "dynamic": dynamic.as_dict()}


def search_settings(model, valid: np.ndarray, hp: Hyperparameters, rms, tokens: int, max_cost: float | None,
                    bptt: int, longest: int, options: dict, log: Callable[[str], None]) -> tuple[Hyperparameters, dict]:
    """Coordinate search (:mod:`.search`) on the first ``tokens`` of ``valid``, segments of at most ``longest``
    tokens; ``max_cost``: rule out settings that take more than this many times the CPU time of the prefix's
    static evaluation."""
    streams, episodic = options["streams"], options["boundary"] is not None
    prefix = valid[: tokens + streams] if not episodic else valid[:tokens]
    statics: dict[int, Any] = {}  # by window: a model that reads in segments is compared cut as it is adapted

    def static_for(segment_length: int):
        window = static_window(model, bptt, segment_length)
        if window not in statics:
            statics[window] = static_pass(model, prefix, streams, window, options["factor"])
        return statics[window]

    log(f"searching on the first {len(prefix):,} validation tokens"
        + ("" if episodic else f" (static xent {static_for(hp.segment_length).scores.xent:.4f})"))

    results: dict[Hyperparameters, Any] = {}

    def score(candidate: Hyperparameters) -> tuple[float, dict]:
        static = None if episodic else static_for(candidate.segment_length)
        results[candidate] = result = dynamic_evaluate(model, prefix, candidate, rms, static=static, **options)
        feasible = max_cost is None or result.cost <= max_cost
        return (result.scores.xent if feasible else float("inf")), {"xent": result.scores.xent, "cost": result.cost}

    order = ORDER if max_cost is None else ORDER_WITH_BUDGET
    if max_cost is not None:
        hp = hp.with_(segment_length=longest)
    order = tuple(c for c in order if not (episodic and c == "decay"))  # episodic: decay stays 0
    start = hp
    best, trials = coordinate_search(score, hp, order, longest, log)
    log(f"best: {best.label()}")
    if not any(t["objective"] < float("inf") for t in trials):
        raise MoglmError(f"search: no setting ran within {max_cost}x the static evaluation time")
    gain, noise = gain_and_noise(results[best].static_losses, results[best].losses)
    kept = best
    if best != start and not gain > 2 * noise:  # a gain the text's own variation could give is not kept
        log(f"the best setting gains {gain:+.4f} nats per token over static on the search's tokens, within twice "
            f"its noise ({noise:.4f}): keeping the start, {start.label()}")
        kept = start
    return kept, {"tokens": len(prefix), "max_cost": max_cost, "trials": trials, "best": best.as_dict(),
                  "gain": gain, "noise": noise, "kept": kept.as_dict()}


def gain_and_noise(static_losses, dynamic_losses, block: int = 50) -> tuple[float, float]:
    """The mean per-token gain of dynamic over static evaluation (nats) and its standard error, from the means
    of blocks of ``block`` consecutive tokens (neighbouring tokens' gains are correlated)."""
    as_numpy = lambda x: np.asarray(x.detach().cpu() if hasattr(x, "detach") else x, dtype=np.float64)  # noqa: E731
    diff = (as_numpy(static_losses) - as_numpy(dynamic_losses)).reshape(-1)  # [N]
    if diff.size == 0:
        return 0.0, math.inf
    n = diff.size // block
    if n < 2:
        return float(diff.mean()), math.inf
    means = diff[: n * block].reshape(n, block).mean(1)  # [blocks]
    return float(diff.mean()), float(means.std(ddof=1) / math.sqrt(n))
