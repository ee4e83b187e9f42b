"""The final evaluation of a run (docs/method.md, "Evaluation"): the best checkpoint, a softmax temperature
searched on validation, each split as one continuous stream from a zero state, and optionally MC
dropout. Results go to ``results.json`` in the run directory."""

from __future__ import annotations

import math
from typing import Any, Callable

from ..evaluation.mc_dropout import evaluate_mc_dropout
from ..evaluation.scores import Scores, adds_bits_per_byte, in_unit
from ..evaluation.stream import evaluate_episodes, evaluate_stream
from ..evaluation.temperature import search_temperature
from ..progress import above_bars
from ..provenance import write_result
from ..recurrence import cuda_graphs as graphs
from ..errors import MoglmError
from ..device import resolve_device
from ..runs.build import load_data
from ..runs.language_model import LanguageModelRun


def evaluate_run(
    run: LanguageModelRun,
    splits: list[str] | None = None,
    batch_size: int | None = None,
    temperature: float | None = None,
    mc_samples: int | None = None,
    mc_dropout_multiplier: float | None = None,
    which: str = "best",
    device: str | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
    write: bool = True,
    cuda_graphs: bool | None = None,
) -> dict[str, Any]:
    """Evaluate a run's checkpoint; arguments left ``None`` come from the run's ``[evaluation]`` config.
    ``temperature=None`` with ``temperature_search`` on searches the factor on validation. ``cuda_graphs``: the
    recurrent windows as CUDA graphs as ``--cuda-graphs/--no-cuda-graphs`` say (``None``, auto: on a CUDA device;
    :func:`moglm.recurrence.cuda_graphs.resolve`)."""
    _check_arguments(batch_size, temperature, mc_samples, mc_dropout_multiplier)
    cfg = run.load_config()
    dev = resolve_device(device or cfg.train.device)
    with graphs.where_possible(cuda_graphs, dev, above_bars(log), "--cuda-graphs"):
        return _evaluate(run, cfg, dev, splits, batch_size, temperature, mc_samples, mc_dropout_multiplier, which,
                         progress, log, write)


def _evaluate(run: LanguageModelRun, cfg, dev, splits, batch_size, temperature, mc_samples, mc_dropout_multiplier,
              which: str, progress: bool, log: Callable[[str], None], write: bool) -> dict[str, Any]:
    """:func:`evaluate_run` on the resolved config ``cfg`` and device ``dev``, inside its CUDA graphs setting."""
    ev = cfg.evaluation
    model, _, _ = run.load_model(which, dev)
    corpus = load_data(cfg.data)
    trained_on = run.model_info().get("corpus_digest")
    if trained_on is not None and trained_on != corpus.digest():
        raise MoglmError(f"{run.path}: the corpus ({cfg.data.path or 'the default'}) changed since this run trained "
                         "on it; its scores would be of other text. Restore the corpus, or train a new run")
    splits = list(splits or ev.splits)
    batch_size = batch_size or ev.batch_size
    mc_samples = ev.mc_samples if mc_samples is None else mc_samples
    multiplier = mc_dropout_multiplier or ev.mc_dropout_multiplier
    pointer = run.checkpoints.pointer(which)
    results: dict[str, Any] = {"checkpoint": {"which": which, "step": pointer["step"],
                                              "weights": pointer.get("weights", "model")}}
    factor = 1.0
    search = temperature is None and ev.temperature_search and not cfg.data.episodic
    search_tokens = temperature_search_tokens(cfg, pointer.get("tokens"))
    limit = ev.max_tokens
    scored = {split: min(len(corpus[split]) - 1, limit) if limit else len(corpus[split]) - 1 for split in splits}
    plan = ", ".join(f"{split} {n:,} tokens" for split, n in scored.items())
    log(f"final evaluation of the {which} checkpoint (step {pointer['step']}): "
        + (f"temperature search on {search_tokens:,} validation tokens, then " if search else "")
        + f"{plan} at batch size {batch_size}" + (f", {mc_samples} MC-dropout passes each" if mc_samples else ""))
    if temperature is not None:
        factor = temperature
    elif search:
        factor, tried = search_temperature(model, corpus["valid"], search_tokens, cfg.train.eval_batch_size,
                                           cfg.train.bptt)
        results["temperature_search"] = {str(k): v for k, v in tried.items()}
        log(f"logit factor {factor:.2f} (a softmax temperature of {1 / factor:.2f}), searched on {search_tokens:,} "
            "validation tokens")
    results["temperature"] = factor
    results["batch_size"] = batch_size
    if limit is not None:
        results["max_tokens"] = limit
    results["splits"] = {}
    for split in splits:
        if cfg.data.episodic:
            scores = evaluate_episodes(model, corpus[split], corpus.separator_id(), batch_size, limit, factor)
        else:
            scores = evaluate_stream(model, corpus[split], batch_size, cfg.train.bptt, factor, limit,
                                     text=corpus.text(split), progress=progress, desc=split)
        results["splits"][split] = scores.as_dict()
        log(f"{split}: {scores.headline(corpus.format)}")
    if mc_samples:
        results["mc_dropout"] = {"samples": mc_samples, "multiplier": multiplier, "splits": {}}
        for split in splits:
            scores: Scores = evaluate_mc_dropout(model, corpus[split], mc_samples, multiplier, cfg.train.bptt,
                                                 factor, limit, text=corpus.text(split), progress=progress)
            results["mc_dropout"]["splits"][split] = scores.as_dict()
            log(f"{split} (MC dropout, {mc_samples} samples): {scores.headline(corpus.format)}")
    results["level"] = corpus.format
    if write:  # every score was printed above: a failed write loses nothing but the file
        try:
            write_result(run.results_path, results, cfg.train.seed)
        except OSError as e:
            raise MoglmError(f"{run.results_path}: could not be written ({e.strerror}); the results printed above "
                             "were not saved") from None
    return results


def _check_arguments(batch_size, temperature, mc_samples, multiplier) -> None:
    """Arguments that would silently give wrong scores are errors (a temperature of 0 is not 'the default')."""
    if batch_size is not None and batch_size < 1:
        raise MoglmError(f"batch size must be >= 1, got {batch_size}")
    if temperature is not None and not (math.isfinite(temperature) and temperature > 0):
        raise MoglmError(f"the softmax temperature (logit factor) must be a finite number > 0, got {temperature}")
    if mc_samples is not None and mc_samples < 0:
        raise MoglmError(f"MC-dropout samples must be >= 0, got {mc_samples}")
    if multiplier is not None and not (math.isfinite(multiplier) and 0 < multiplier <= 1):
        raise MoglmError(f"the MC-dropout multiplier must be in (0, 1], got {multiplier}")


def temperature_search_tokens(cfg, trained_tokens: int | None) -> int:
    """``evaluation.temperature_tokens``, or by default 50,000 validation tokens, or the tokens the run
    trained on when fewer (a 40-step run should not pay minutes of search)."""
    if cfg.evaluation.temperature_tokens is not None:
        return cfg.evaluation.temperature_tokens
    return max(1_000, min(50_000, trained_tokens or 50_000))


def final_block(results: dict[str, Any], cfg) -> list[str]:
    """The end of ``moglm train``: what the final scores scored, and why they differ from the last validation
    line, in the validation lines' unit (the scores themselves were printed as they were computed)."""
    point = results["checkpoint"]
    weights = "averaged weights" if point.get("weights") == "averaged" else "raw weights"
    factor = results.get("temperature", 1.0)
    prefix = f"the first {cfg.train.eval_tokens:,} tokens of" if cfg.train.eval_tokens else "all of"
    read = f"its first {results['max_tokens']:,} tokens" if results.get("max_tokens") else "whole"
    return [f"final scores above: the {point['which']} checkpoint (step {point['step']}, {weights}), each split read "
            f"{read} at batch size {results['batch_size']}, logit factor {factor:.2f}; the validation "
            f"lines during training read {prefix} valid at batch size {cfg.train.eval_batch_size} with factor 1.00, "
            "so the two differ"]


def headline(results: dict[str, Any], split: str = "valid") -> str:
    """'valid 1.2340 bpc' / 'valid ppl 56.70' from a results dict, and its bits per byte where the text's bytes
    are known."""
    s = results["splits"][split]
    level = results.get("level", "char")
    shown = "bits_per_byte" in s and adds_bits_per_byte(level, s.get("tokens"), s.get("bytes"))
    bpb = f" ({s['bits_per_byte']:.4f} bits per byte)" if shown else ""
    return f"{split} {in_unit(s['xent'], level)}{bpb}"

