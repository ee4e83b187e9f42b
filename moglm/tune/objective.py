"""One trial: a run config from the sampled parameters, training with pruning, the paper's objective.

The objective is the validation cross-entropy (nats per token) of the run's best checkpoint (averaged
weights once averaging started) with the softmax temperature searched on validation, exactly what
``moglm train`` reports at its end (:func:`moglm.train.evaluate_run` on the valid split). Every
validation during training is reported to the trial, so the study's pruner can stop bad trials early.

Each trial trains in its own run directory, ``<study dir>/trials/<run>``; a trial re-queued after an
interruption or a dead worker keeps the run directory of the trial it replaces and resumes its
training from the last checkpoint.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import torch

from ..errors import MoglmError
from ..model.language_model import embedding_size
from ..progress import above_bars
from ..runs.build import load_data, resolve_hidden_size
from ..runs.config import RunConfig, apply_overrides, locate, read_mapping, validate
from .. import distributed
from ..train.engine import Evaluation, TrainingInterrupted
from ..train.trainer import total_steps, train_and_evaluate
from .search_space import SearchSpace, set_dotted

MAX_ATTEMPTS = 2  # a trial whose worker died is re-queued once (a second death is probably the trial's fault)


@dataclass
class TrialSetup:
    """Everything a trial needs; picklable, so worker processes receive it whole."""

    space: SearchSpace
    space_name: str
    base_name: str
    base: dict[str, Any]  # the base config mapping with the space's [fixed] and --set applied
    trial_overrides: dict[str, Any] = field(default_factory=dict)  # dotted keys: [trial] and the token budget
    study_dir: Path = Path("studies")

    def configs(self, values: dict[str, Any]) -> tuple[dict[str, Any], RunConfig]:
        """The ready-to-train mapping (base + values) and the trial's run config (plus trial overrides)."""
        ready = copy.deepcopy(self.base)
        for key, value in values.items():
            set_dotted(ready, key, value)
        trial = copy.deepcopy(ready)
        for key, value in self.trial_overrides.items():
            set_dotted(trial, key, value)
        return ready, self.build_config(trial)

    def build_config(self, mapping: dict[str, Any]) -> Any:
        """The trial's config from its mapping (a run config here; a task's config in subclasses)."""
        return validate(mapping, f"{self.space_name} on {self.base_name}")

    def objective(self) -> "Objective":
        return Objective(self)

    def pruning_warmup_steps(self) -> tuple[int, int, int]:
        """(warm-up steps, training steps, evaluation interval) of a trial with the base settings."""
        _, cfg = self.configs(self.representative_values())
        steps = total_steps(cfg)
        return int(self.space.pruner.warmup * steps), steps, cfg.train.eval_every

    def representative_values(self) -> dict[str, Any]:
        return {k: (p.choices[0] if p.choices is not None else (int(p.low) if p.integer else p.low))
                for k, p in self.space.params.items()}


def prepare(space: SearchSpace, space_name: str, base: str | None, overrides: list[str], max_tokens: int | None,
            study_dir: Path) -> TrialSetup:
    """Check that the space applies to its base config (keys, architecture options) before any trial runs."""
    base = base or space.base
    if base is None:
        raise MoglmError(f"search space {space_name} names no base config: pass --base CONFIG")
    path = locate(base)
    data = read_mapping(path)
    data.setdefault("name", path.stem)
    for key, value in space.fixed.items():
        set_dotted(data, key, value)
    data = apply_overrides(data, list(overrides))
    validate(copy.deepcopy(data), str(path))
    trial_overrides = dict(space.trial)
    tokens = max_tokens or space.budget.max_tokens
    if tokens:
        trial_overrides["train.max_tokens"] = tokens
    setup = TrialSetup(space, space_name, path.stem, data, trial_overrides, Path(study_dir))
    setup.configs(setup.representative_values())  # every key applies to this base (e.g. cell options)
    return setup


def fit_rank(cfg: RunConfig, vocab_size: int) -> tuple[RunConfig, dict[str, Any]]:
    """A mogrifier rank above min(embedding, hidden) size is full rank (the factorisation spans every
    matrix then); returns the config actually trained and what was changed, e.g. ``{"model.cell.rank": 0}``."""
    rank = cfg.model.cell.get("rank")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0 or cfg.model.cell.get("rounds") == 0:
        return cfg, {}
    try:  # a budget-sized model: the smallest hidden size that takes this rank may already exceed the budget
        hidden = resolve_hidden_size(cfg.model, vocab_size)
    except MoglmError:
        hidden = None
    # every layer's input is the embedding (<= hidden) or the hidden state
    if hidden is None or rank > embedding_size(hidden, cfg.model.input_embedding_ratio):
        data = cfg.model_dump(mode="json", exclude_none=True)
        data["model"]["cell"]["rank"] = 0
        return validate(data), {"model.cell.rank": 0}
    return cfg, {}


class Objective:
    """The callable handed to ``study.optimize``; ``interrupted`` is set when Ctrl-C stopped a trial."""

    def __init__(self, setup: TrialSetup, log_to_stdout: bool = False, progress: bool = False) -> None:
        self.setup = setup
        self.log_to_stdout = log_to_stdout  # every log line also on stdout, as "[trial N] line"
        self.progress = progress  # a progress bar per trial
        self.interrupted = False

    def __call__(self, trial: optuna.Trial) -> float:
        try:
            return self._run(trial)
        except optuna.TrialPruned:
            raise
        except TrainingInterrupted:
            self.interrupted = True
            if "config" in trial.user_attrs:  # resume it next time, in the same run directory
                trial.study.enqueue_trial(trial.params, user_attrs={"run": trial.user_attrs["run"],
                                                                    "replaces": trial.number})
            trial.study.stop()
            raise
        except Exception as e:  # recorded as a failed trial (the study catches it and goes on)
            trial.set_user_attr("error", f"{type(e).__name__}: {e}"[:2000])
            if torch.cuda.is_available():
                torch.cuda.empty_cache()  # after an out-of-memory error, for the next trial
            raise

    def trial_run_dir(self, trial: optuna.Trial) -> Path:
        """The trial's run directory (a re-queued trial's is the one of the trial it replaces), recorded with
        the attempt and the host in the trial's attributes."""
        run_number = trial.user_attrs.get("run", trial.number)
        run_dir = self.setup.study_dir / "trials" / f"{run_number:04d}"
        trial.set_user_attr("run", run_number)
        trial.set_user_attr("attempt", trial.user_attrs.get("attempt", 1))
        trial.set_user_attr("run_dir", str(run_dir.resolve()))
        trial.set_user_attr("host", socket.gethostname())
        return run_dir

    @contextmanager
    def trial_training(self, trial: optuna.Trial, run_dir: Path, first_line: str
                       ) -> Iterator[tuple[Callable[[str], None], Callable[[Evaluation], None]]]:
        """Prepare ``run_dir`` (a new trial's starts empty; a re-queued one resumes) and give the trial's
        ``log`` (to ``tune.log``, and stdout with ``log_to_stdout``) and its ``report`` of each validation
        (to the trial, which the pruner may stop)."""
        fresh, main = trial.user_attrs["run"] == trial.number, distributed.is_main_process()
        if main and fresh and run_dir.exists():  # under torchrun, rank 0 owns the trial's files
            shutil.rmtree(run_dir)  # left over from an earlier study in the same directory
        if main:
            run_dir.mkdir(parents=True, exist_ok=True)
        with open(run_dir / "tune.log" if main else os.devnull, "a") as log_file:
            def log(message: str) -> None:
                log_file.write(message + "\n")
                log_file.flush()
                if self.log_to_stdout:
                    above_bars(lambda line: print(line, flush=True))(f"[trial {trial.number}] {message}")

            def report(evaluation: Evaluation) -> None:
                xent = evaluation.scores["xent"]
                trial.report(xent, evaluation.step)
                if trial.should_prune():
                    raise optuna.TrialPruned(f"pruned at step {evaluation.step} (valid xent {xent:.4f})")

            log(first_line)
            yield log, report

    def _run(self, trial: optuna.Trial) -> float:
        setup = self.setup
        run_dir = self.trial_run_dir(trial)
        run_number = trial.user_attrs["run"]
        values = {name: spec.suggest(trial, name) for name, spec in setup.space.params.items()}
        ready, cfg = setup.configs(values)
        cfg, changed = fit_rank(cfg, len(load_data(cfg.data).vocab))
        for key, value in changed.items():
            set_dotted(ready, key, value)
        trial.set_user_attr("changed", changed)
        trial.set_user_attr("config", ready)
        cfg = cfg.model_copy(update={"name": trial_title(trial.study.study_name, run_number, values)})
        start = time.monotonic()
        first_line = f"trial {trial.number}: {json.dumps(values)}" + (f"; changed {changed}" if changed else "")
        with self.trial_training(trial, run_dir, first_line) as (log, report):
            progress, results = train_and_evaluate(cfg, run_dir, splits=["valid"], progress=self.progress, log=log,
                                                   on_evaluation=report)
        valid = results["splits"]["valid"]
        info = json.loads((run_dir / "model.json").read_text())
        trial.set_user_attr("level", results.get("level"))
        trial.set_user_attr("temperature", results.get("temperature"))
        trial.set_user_attr("valid", {k: v for k, v in valid.items() if v is not None})
        trial.set_user_attr("hidden_size", info["hidden_size"])
        trial.set_user_attr("num_params", info["num_params"])
        trial.set_user_attr("steps", progress.step)
        trial.set_user_attr("tokens", progress.tokens)
        trial.set_user_attr("seconds", round(time.monotonic() - start, 1))
        return float(valid["xent"])


def trial_title(study_name: str, run: int, values: dict[str, Any]) -> str:
    """A trial's run name, which titles its learning curve: the study, the trial's run and its parameters."""
    shown = ", ".join(f"{key.rsplit('.', 1)[-1]}={value:.3g}" if isinstance(value, float)
                      else f"{key.rsplit('.', 1)[-1]}={value}" for key, value in values.items())
    return f"{study_name} trial {run}: {shown}"


def requeue_stale_trial(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
    """Heartbeat callback: a trial whose worker died (killed, out of memory) runs again, resuming its
    run directory, unless it already had ``MAX_ATTEMPTS`` attempts."""
    attempt = trial.user_attrs.get("attempt", 1)
    if "config" not in trial.user_attrs or attempt >= MAX_ATTEMPTS:
        return
    run = trial.user_attrs.get("run", trial.number)
    study.enqueue_trial(trial.params, user_attrs={"run": run, "replaces": trial.number, "attempt": attempt + 1})
