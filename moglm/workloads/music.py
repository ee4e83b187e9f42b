"""The music workload (:mod:`moglm.registry`). One run of a music experiment (Krause thesis 4.8, table 4.6): train an RNN-NADE from a shipped music config,
score the best checkpoint's log-likelihood per frame, then dynamic evaluation with SGD and with global RMS, each
searched on validation and scored on test, the weights and state reset at every song."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from ..provenance import write_result
from ..experiments.runner import EVALUATION_FILES
from ..experiments.spec import RunSpec, Scale

RULES = {"dynamic_sgd": "sgd", "dynamic_rms": "rms"}


def music_config(spec: RunSpec, name: str | None = None):
    """The run's music config: the shipped config the template names, then the experiment's overrides."""
    from ..music.config import load_music_config

    overrides = [f"{key}={json.dumps(value)}" for key, value in spec.overrides.items()]
    cfg = load_music_config(spec.config, overrides)
    return cfg.model_copy(update={"name": name or spec.name})


def run_music_spec(spec: RunSpec, run_dir: Path, evaluations: list[str], scale: Scale, progress: bool,
                   log: Callable[[str], None]) -> None:
    """Train (or resume), then each evaluation not yet in ``run_dir/evaluations``: dynamic evaluation searched on
    the first ``scale.search_tokens`` frames of validation songs, scoring the first ``scale.eval_tokens`` frames
    of each split (songs whole; default all)."""
    from ..music.run import dyneval_music_run
    from ..music.training import MusicRun, train_music

    folder = run_dir / "evaluations"
    static = folder / EVALUATION_FILES["static"]
    if not static.is_file():
        _, results = train_music(music_config(spec), run_dir, progress=progress, log=log)
        write_result(static, results | {"level": "music"}, spec.seed)
    for evaluation in evaluations:
        path = folder / EVALUATION_FILES[evaluation]
        if evaluation not in RULES or path.is_file():
            continue
        found = dyneval_music_run(MusicRun(run_dir), RULES[evaluation], ("valid", "test"), search=True,
                                  progress=progress, log=log, search_frames=scale.search_tokens,
                                  frames=scale.eval_tokens)
        write_result(path, found | {"level": "music"}, spec.seed)


# -- the registry's hooks --------------------------------------------------------------------------------
def experiment_config(spec: RunSpec) -> dict:
    return music_config(spec).model_dump(mode="json")


def experiment_run(exp, scale: str, spec: RunSpec, run_dir: Path, evaluations: list[str], progress: bool,
                   log: Callable[[str], None], sizes) -> None:
    run_music_spec(spec, run_dir, evaluations, sizes, progress, log)
