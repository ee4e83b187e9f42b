"""One reverse-copy run of an experiment (Mogrifier paper 4.3, figure 4): tune the learning rate and the
l2 penalty for this model and length with ``moglm tune`` (a study beside the runs), then train the best
setting and score it on the test set by length."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..provenance import write_result
from .runner import EVALUATION_FILES
from .spec import Experiment, RunSpec, scale_of


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
