"""The reverse-copy workload (:mod:`moglm.registry`). One reverse-copy run of an experiment (Mogrifier paper 4.3, figure 4): tune the learning rate and the
l2 penalty for this model and length with ``moglm tune`` (a study beside the runs), then train the best
setting and score it on the test set by length."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Callable

from ..provenance import write_result
from ..experiments.runner import EVALUATION_FILES
from ..errors import MoglmError
from ..experiments.spec import Experiment, RunSpec, Scale, scale_of


def run_reverse_copy_spec(exp: Experiment, scale: str, spec: RunSpec, run_dir: Path, progress: bool,
                          log: Callable[[str], None]) -> None:
    import torch

    from ..tasks.reverse_copy import ReverseCopyConfig, run_reverse_copy
    from ..tune.reverse_copy import tune_reverse_copy

    static = run_dir / "evaluations" / EVALUATION_FILES["static"]
    if static.is_file():
        return
    fixed = dict(spec.overrides)
    best: dict = {}
    if spec.tune:
        study = run_dir.parent.parent / "studies" / run_dir.name
        trials = scale_of(exp, scale).tune_trials
        log(f"tuning the learning rate and l2 penalty: {trials} trials of {spec.tune} in {study}")
        best = tune_reverse_copy(spec.tune, study, fixed=fixed, trials=trials, threads=torch.get_num_threads(), log=log)
        log(f"best: {best}")
    results = run_reverse_copy(ReverseCopyConfig(**(fixed | best)), run_dir, progress=progress, log=log)
    write_result(static, results, spec.seed)


# -- the registry's hooks --------------------------------------------------------------------------------
def experiment_config(spec: RunSpec) -> dict:
    return {"task": "reverse_copy", "config": spec.config, "overrides": spec.overrides, "tune": spec.tune}


def experiment_runs(exp: Experiment, sc: Scale, data: str | None) -> list[RunSpec]:
    """One run per length x variant x seed (the paper's figure 4 grid); the task makes its own sequences."""
    if data is not None:
        raise MoglmError(f"{exp.name} generates its own sequences: --data does not apply to it")
    return _reverse_copy_runs(exp, sc)


def experiment_run(exp: Experiment, scale: str, spec: RunSpec, run_dir: Path, evaluations: list[str],
                   progress: bool, log: Callable[[str], None], sizes) -> None:
    run_reverse_copy_spec(exp, scale, spec, run_dir, progress, log)


def tuning_prepare(space, space_name: str, base: str | None, overrides: list[str], max_tokens: int | None,
                   directory: Path):
    from ..tune.reverse_copy import prepare_reverse_copy

    return prepare_reverse_copy(space, space_name, base, overrides, max_tokens, directory)


def tuning_key_problem(key: str) -> str | None:
    from ..tune.reverse_copy import key_problem

    return key_problem(key)


def tuning_best(result, best, storage: str) -> tuple[str, str, str]:
    from ..tune.reverse_copy import best_settings_text

    return "best settings", "best_reverse_copy.toml", best_settings_text(result.study, best, storage)


def _reverse_copy_runs(exp: Experiment, sc: Scale) -> list[RunSpec]:
    out = []
    for length in sc.lengths:
        for variant_name, variant in exp.variants.items():
            for seed in sc.seeds or exp.seeds:
                overrides = copy.deepcopy(sc.set) | copy.deepcopy(variant.set) | {"length": length, "seed": seed}
                out.append(RunSpec(f"length{length}-{variant_name}-s{seed}", "reverse-copy", variant_name, seed,
                                   "reverse-copy", overrides, float(length), variant.tune))
    return out
