"""The language-model workload (:mod:`moglm.registry`). One language-model run of an experiment: its config, its training, its evaluations (Mogrifier paper
section 3.3: static with the softmax temperature searched on validation, MC dropout, dynamic evaluation,
and MC dropout with dynamic evaluation; Krause thesis 3.5: per-token losses for the surprise analysis;
thesis 2.2.1 and tables 4.1-4.2: the neural cache, alone and with dynamic evaluation)."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any, Callable

import torch

from ..provenance import write_result
from ..errors import MoglmError
from ..runs.config import apply_overrides, locate, read_mapping, validate
from ..experiments.runner import EVALUATION_FILES, save_token_losses
from ..experiments.spec import RunSpec, Scale


def run_config(spec: RunSpec, name: str | None = None):
    """The run's config: the template's shipped config, then the scale's, corpus's and variant's overrides
    (``name``: the run directory's, when another experiment's run is shared)."""
    path = locate(spec.config)
    data = read_mapping(path)
    data["name"] = name or spec.name
    overrides = [f"{key}={json.dumps(value)}" for key, value in spec.overrides.items()]
    return validate(apply_overrides(data, overrides), f"{path} with {spec.name}'s overrides")


def train_run_spec(spec: RunSpec, run_dir: Path, progress: bool, log: Callable[[str], None]) -> None:
    """Train (or resume) the run; its final evaluation becomes ``evaluations/static.json``."""
    from ..train.trainer import train_and_evaluate

    static = run_dir / "evaluations" / EVALUATION_FILES["static"]
    if static.is_file():
        return
    cfg = run_config(spec, run_dir.name)
    _, results = train_and_evaluate(cfg, run_dir, splits=["valid", "test"], progress=progress, log=log)
    write_result(static, results, cfg.train.seed)


def evaluate_run_spec(scale: Scale, run_dir: Path, evaluations: list[str], progress: bool,
                      log: Callable[[str], None]) -> None:
    """The evaluations of ``evaluations`` (besides static) that are not on disk yet."""
    from ..runs.language_model import LanguageModelRun

    run = LanguageModelRun(run_dir)
    folder = run_dir / "evaluations"
    config = run.load_config()
    seed = config.train.seed
    if config.train.threads:  # as its training did, also when another experiment trained it
        torch.set_num_threads(config.train.threads)
    with run.lock():
        for name in evaluations:
            path = folder / EVALUATION_FILES[name]
            if name == "static" or path.is_file():
                continue
            log(f"evaluation: {name}")
            # dropout masks drawn from the run's seed and the evaluation's name, not from the process's past
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
                _evaluate(name, run, scale, folder, path, progress, log, seed)


def _evaluate(name: str, run, scale: Scale, folder: Path, path: Path, progress: bool,
              log: Callable[[str], None], seed: int | None = None) -> None:
    """One evaluation, written to ``path`` with its provenance (and, for the dynamic pass over test, the token
    losses)."""
    if name in ("mc_dropout", "mc_dropout_searched"):  # the latter: the paper's scaled rates (section 3.3)
        searched = name == "mc_dropout_searched" or scale.mc_multiplier_search
        report = mc_dropout(run, scale.mc_samples, scale.eval_tokens, progress, log,
                            scale.search_tokens if searched else None)
        write_result(path, report, seed)
    elif name == "mc_dynamic":
        report = _dynamic(run, scale, scale.mc_dynamic_samples, ("valid", "test"), progress, log)
        write_result(path, report, seed)
    elif name == "out_of_domain":
        from ..experiments.out_of_domain import out_of_domain

        if scale.target is None:
            raise MoglmError("the out_of_domain evaluation needs the scale's target corpus (target = ...)")
        report = out_of_domain(run, scale.target, scale.eval_tokens, scale.search_tokens, progress, log)
        write_result(path, report, seed)
    elif name == "optimisers":  # Krause thesis 5.4: every optimiser tuned and scored on the same prefixes
        from ..experiments.optimisers import compare_optimisers

        write_result(path, compare_optimisers(run, scale, progress, log), seed)
    elif name in ("cache", "dynamic_cache"):  # one static and one dynamic pass give both, and dynamic.json
        cache_evaluations(run, scale, folder, progress, log, seed)
    elif name in ("dynamic", "token_losses"):  # the dynamic pass over test gives the token losses too
        splits = ("valid", "test") if name == "dynamic" else ("test",)
        report = token_losses(run, scale, splits, folder / EVALUATION_FILES["token_losses"], progress, log)
        if name == "dynamic":
            write_result(path, report, seed)


def cache_evaluations(run, scale: Scale, folder: Path, progress: bool, log: Callable[[str], None],
                      seed: int | None = None) -> None:
    """Static + neural cache and dynamic + cache of valid and test (theta and lambda searched on validation,
    :mod:`moglm.dynamic_evaluation.with_cache`), each beside the static score of the same tokens; the
    dynamic pass is the ``dynamic`` evaluation too, written when it is not on disk yet."""
    report = _dynamic(run, scale, 0, ("valid", "test"), progress, log, cache=True)
    for name, row in (("cache", "static"), ("dynamic_cache", "dynamic")):
        out = {"level": report["level"], "temperature": report["temperature"], "cache": report["cache"][row],
               "hyperparameters": report["hyperparameters"] if row == "dynamic" else None,
               "splits": {split: block["cache"][row] | {"static": block["static"]}
                          for split, block in report["splits"].items()}}
        write_result(folder / EVALUATION_FILES[name], out, seed)
    if not (folder / EVALUATION_FILES["dynamic"]).is_file():
        for block in report["splits"].values():
            block.pop("cache", None)
        write_result(folder / EVALUATION_FILES["dynamic"], report, seed)


def mc_dropout(run, samples: int, tokens: int | None, progress: bool, log: Callable[[str], None],
               search_tokens: int | None = None) -> dict[str, Any]:
    """MC-dropout scores of valid and test (the first ``tokens`` of each, or all), with the deterministic
    scores of the same tokens beside them (the run's temperature; its dropout multiplier, or with
    ``search_tokens`` the one searched on that many validation tokens)."""
    from ..evaluation.stream import evaluate_stream
    from ..evaluation.mc_dropout import evaluate_mc_dropout
    from ..runs.build import load_data

    cfg = run.load_config()
    model, _, _ = run.load_model("best")
    corpus = load_data(cfg.data)
    factor = _temperature(run)
    multiplier = cfg.evaluation.mc_dropout_multiplier
    searched = None
    if search_tokens:
        from ..evaluation.mc_dropout import search_multiplier

        multiplier, searched = search_multiplier(model, corpus["valid"], samples, cfg.train.bptt, factor, search_tokens)
        log(f"MC dropout: multiplier {multiplier:g} (searched on {search_tokens:,} validation tokens: "
            + ", ".join(f"{m}: {x:.4f}" for m, x in searched.items()) + ")")
    out: dict[str, Any] = {"samples": samples, "multiplier": multiplier, "multiplier_search": searched,
                           "temperature": factor, "tokens": tokens, "splits": {}, "static": {}}
    for split in ("valid", "test"):
        ids = corpus[split] if tokens is None else corpus[split][: tokens + 1]
        text = corpus.text(split) if tokens is None else None
        scores = evaluate_mc_dropout(model, ids, samples, multiplier, cfg.train.bptt, factor, text=text,
                                     progress=progress)
        out["splits"][split] = scores.as_dict()
        out["static"][split] = evaluate_stream(model, ids, 1, cfg.train.bptt, factor, text=text).as_dict()
        log(f"{split} (MC dropout, {samples} samples): {scores.headline(corpus.format)}")
    out["level"] = corpus.format
    return out


def _dynamic(run, scale: Scale, mc_samples: int, splits: tuple[str, ...], progress: bool,
             log: Callable[[str], None], on_result=None, cache: bool = False) -> dict[str, Any]:
    from ..dynamic_evaluation.run import dyneval_run
    from ..dynamic_evaluation.statistics import StatisticsSettings

    report = dyneval_run(run, splits, eval_tokens=scale.eval_tokens, mc_samples=mc_samples, on_result=on_result,
                         statistics=StatisticsSettings(scale.stats_fraction, scale.stats_batch_size),
                         cache=cache, search=scale.dynamic_search, max_cost=scale.dynamic_max_cost,
                         search_tokens=scale.search_tokens, progress=progress, log=log, write=False)
    for split in report["splits"].values():
        split.pop("profile", None)
    return report


def token_losses(run, scale: Scale, splits: tuple[str, ...], path: Path, progress: bool,
                 log: Callable[[str], None]) -> dict[str, Any]:
    """Dynamic evaluation of ``splits`` (ending with test); the per-token test losses, static and dynamic
    (one stream), go to ``path`` for the surprise analysis. Returns the dynamic-evaluation report."""
    kept: dict[str, Any] = {}

    def keep(split, result) -> None:
        if split == "test":
            kept["static"], kept["dynamic"] = result.static_losses.flatten(), result.losses.flatten()  # [L] each

    report = _dynamic(run, scale, 0, splits, progress, log, on_result=keep)
    save_token_losses(path, kept["static"], kept["dynamic"],
                      {"split": "test", "level": report["level"], "temperature": report["temperature"],
                       "hyperparameters": report["hyperparameters"]})
    return report


def _temperature(run) -> float:
    static = run.path / "evaluations" / EVALUATION_FILES["static"]
    return float(json.loads(static.read_text())["temperature"])


# -- the registry's hooks --------------------------------------------------------------------------------
def experiment_config(spec: RunSpec) -> dict[str, Any]:
    from ..runs.config import run_identity

    return run_identity(run_config(spec).model_dump(mode="json"))


def experiment_run(exp, scale: str, spec: RunSpec, run_dir: Path, evaluations: list[str], progress: bool,
                   log: Callable[[str], None], sizes: Scale) -> None:
    """Train (or resume) the run, then each evaluation not yet on disk, sized by ``sizes``."""
    train_run_spec(spec, run_dir, progress, log)
    evaluate_run_spec(sizes, run_dir, evaluations, progress, log)


def tuning_prepare(space, space_name: str, base: str | None, overrides: list[str], max_tokens: int | None,
                   directory: Path):
    from ..tune.objective import prepare

    return prepare(space, space_name, base, overrides, max_tokens, directory)


def tuning_key_problem(key: str) -> str | None:
    from ..runs.config import key_problem

    return key_problem(key)


def tuning_best(result, best, storage: str) -> tuple[str, str, str]:
    from ..tune.report import best_config_text

    return "best config", "best.toml", best_config_text(result, best)
