"""The training engine: one loop for every model moglm trains (language models, the synthetic tasks,
tuning trials), with the Mogrifier paper's recipe (section 3.3; docs/method.md, "Training recipe").

* Adam with beta1 = 0 and a constant learning rate (or the thesis's mLSTM recipe: beta1 0.9, a learning rate
  decaying linearly, thesis 3.5.1; or SGD, the thesis's music models, 4.8); the loss is a step's summed cross-entropy divided by
  its sequences, plus ``l2_penalty * 0.5 * sum(w^2)``; global-norm clipping.
* Evaluation every ``eval_every`` steps on validation; weight averaging after ``averaging_patience``
  evaluations without improvement or at ``averaging_start`` of training; best and last checkpoints;
  optional early stopping.

A :class:`Task` plugs in what differs: the model, the loss of step s, validation, and any state the next
step depends on (a language model's carried recurrent state). The engine owns the rest.

Reliability: every evaluation writes an atomic checkpoint holding everything the next step depends on
(weights, Adam's moments, the average, the task's state, the random number generators, the progress),
so rerunning the same command after a kill continues exactly as the uninterrupted run would. Ctrl-C
saves a checkpoint at the current step first. A non-finite loss or gradient stops the run before the
weights are touched, keeping the last good checkpoint.

Data parallel (:mod:`moglm.distributed`): given a :class:`~moglm.distributed.Group` of
several processes, the engine runs on every rank; the task's loss goes through DDP, the losses and the
stop requests are summed over the ranks, validation runs on rank 0 and only rank 0 writes.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from ..distributed import SINGLE, Group
from ..errors import MoglmError, TrainingInterrupted
from ..progress import progress_bar
from ..recurrence import cuda_graphs
from ..runs import RunDirectory, load_group
from ..runs.checkpoints import load_state
from .learning_curve import plot_learning_curve
from .weight_averaging import WeightAverage


SCHEDULES = ("constant", "linear")
OPTIMIZERS = ("adam", "sgd", "normalised_rmsprop")


class TrainingDiverged(MoglmError):
    """The loss or the gradient became NaN or infinite."""


@dataclass
class Settings:
    """How the engine trains: the optimizer, the schedule of evaluations and the averaging rules."""

    steps: int
    learning_rate: float
    eval_every: int
    schedule: str = "constant"  # or "linear": learning_rate at step 1 down to min_learning_rate at the last step
    min_learning_rate: float = 0.0
    adam_beta1: float = 0.0
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    optimizer: str = "adam"  # "sgd": plain SGD with clipping (the thesis's music models, 4.8), momentum below;
    # "normalised_rmsprop": thesis eq. 3.14 (moglm.train.normalised_rmsprop), alpha adam_beta2, eps adam_eps
    momentum: float = 0.0  # SGD's momentum (0: none)
    clip_norm: float = 10.0
    l2_penalty: float = 0.0
    averaging_patience: int | None = None
    averaging_start: float | None = None
    early_stopping_patience: int | None = None
    tokens_per_step: int = 1  # for the progress bar's tokens/s
    log_every: int = 10  # steps between training-loss records in metrics.jsonl
    # the recurrent layers' fused windows as CUDA graphs in training steps and validations: True (asked for),
    # None (auto: where one CUDA device trains; moglm.recurrence.cuda_graphs.resolve), False (off: the default of
    # the tasks that have no such setting)
    cuda_graphs: bool | None = False

    def __post_init__(self) -> None:
        for name in ("steps", "eval_every", "log_every"):
            if getattr(self, name) < 1:
                raise MoglmError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.learning_rate > 0:
            raise MoglmError(f"the learning rate must be > 0, got {self.learning_rate}")
        if self.schedule not in SCHEDULES:
            raise MoglmError(f"the learning-rate schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.optimizer not in OPTIMIZERS:
            raise MoglmError(f"the optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if not 0 <= self.momentum < 1:
            raise MoglmError(f"momentum must be in [0, 1), got {self.momentum}")
        if self.schedule == "linear" and not 0 <= self.min_learning_rate <= self.learning_rate:
            raise MoglmError(f"min_learning_rate must be in [0, learning_rate], got {self.min_learning_rate}")

    def learning_rate_at(self, step: int) -> float:
        """The learning rate of step ``step`` (1 to ``steps``): a function of the step alone, so a resumed
        run follows the schedule exactly."""
        if self.schedule == "constant" or self.steps == 1:
            return self.learning_rate
        return self.learning_rate + (self.min_learning_rate - self.learning_rate) * (step - 1) / (self.steps - 1)


@dataclass
class StepLoss:
    """A step's loss: the cross-entropy summed over its ``tokens`` scored tokens, and the ``sequences``
    it is averaged over (the batch size). Data parallel: ``summed`` and ``tokens`` are this rank's,
    ``sequences`` the global batch's."""

    summed: Tensor
    tokens: int
    sequences: int


@dataclass
class Evaluation:
    """One validation during training, handed to ``on_evaluation`` (tuning reports ``scores["xent"]``)."""

    step: int
    scores: dict[str, float]
    model: nn.Module  # the weights evaluated: the running average once averaging started
    best: bool


class Task(Protocol):
    """What a task plugs into the engine."""

    model: nn.Module

    def loss(self, step: int) -> StepLoss:
        """The loss of step ``step`` (a function of the step and the task's state, so resuming is exact)."""

    def validate(self, model: nn.Module) -> dict[str, float]:
        """Validation scores of ``model``; ``xent`` (lower is better) picks the best checkpoint."""

    def describe(self, scores: dict[str, float]) -> str:
        """Validation scores as the log line shows them."""

    def state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        """Tensors and JSON the next step depends on beyond the weights (e.g. a carried state); data
        parallel: every rank calls it, and rank 0's result (the global state) is saved."""

    def load_state(self, tensors: dict[str, Tensor], info: dict[str, Any]) -> None:
        """Restore :meth:`state` from a checkpoint."""


class StatelessTask:
    """A task whose steps depend on nothing but the step number and the weights (the synthetic tasks draw
    the batch of step s from a generator seeded by s); subclasses give ``model``, ``loss`` and ``validate``."""

    model: nn.Module

    def describe(self, scores: dict[str, float]) -> str:
        return ", ".join(f"{k} {v:.4g}" for k, v in scores.items() if isinstance(v, float))

    def state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        return {}, {}

    def load_state(self, tensors: dict[str, Tensor], info: dict[str, Any]) -> None:
        pass


@dataclass
class Progress:
    """Where training stands; saved as JSON in every checkpoint."""

    step: int = 0
    tokens: int = 0
    best_xent: float | None = None
    best_step: int | None = None
    evals_without_improvement: int = 0
    averaging_since: int | None = None
    stopped_early: bool = False
    finished: bool = False
    seconds: float = 0.0  # training time over every invocation, evaluations included
    window_nll: float = 0.0  # the training loss summed since the last metrics record
    window_tokens: int = 0


class _InterruptFlag:
    """SIGINT (Ctrl-C) and SIGTERM (a scheduler's or ``kill``'s stop) set a flag checked between steps, so
    the run saves a checkpoint before it stops; a second Ctrl-C interrupts at once. ``received`` keeps the
    last signal handled this way, for a caller that trains in its own process and must stop too (a test run)."""

    SIGNALS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}
    received: int | None = None

    def __init__(self) -> None:
        self.set: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "_InterruptFlag":
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.set and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.set = self.SIGNALS[signum]
        _InterruptFlag.received = signum

    def __exit__(self, *exc) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)


class Engine:
    """Trains ``task.model`` in ``run`` with ``settings`` (resuming from the run's last checkpoint).

    ``log`` prints a line (above the progress bar); ``on_step(step)`` is called after every completed
    step (tests simulate kills with it); ``on_evaluation(Evaluation)`` after every checkpoint (tuning
    prunes with it). ``hparams`` (the run's config, nested) goes to TensorBoard beside the best validation
    score; ``unit`` is what the learning curve plots (``bits``, ``perplexity`` or ``nats``). ``group``: the
    processes training together (data parallel; default one process).
    """

    def __init__(
        self,
        task: Task,
        settings: Settings,
        run: RunDirectory,
        *,
        device: torch.device | str = "cpu",
        title: str | None = None,
        unit: str = "nats",
        progress: bool = True,
        desc: str = "train",
        log: Callable[[str], None] = print,
        on_step: Callable[[int], None] | None = None,
        on_evaluation: Callable[[Evaluation], None] | None = None,
        hparams: dict[str, Any] | None = None,
        group: Group = SINGLE,
    ) -> None:
        self.task, self.settings, self.run, self.group = task, settings, run, group
        if not group.is_main:
            log, progress = (lambda message: None), False
        self.model = task.model
        self.device = torch.device(device)
        self.graphed, line = cuda_graphs.resolve(settings.cuda_graphs, self.device, group.distributed,
                                                 "train.cuda_graphs")
        self.title = title or run.path.name
        self.unit = unit
        self.progress_enabled, self.desc = progress, desc
        self._log, self.on_step, self.on_evaluation = log, on_step, on_evaluation
        if line is not None:
            self._log(line)
        self.hparams = flat_hparams(hparams or {})
        self.parameters = [p for p in self.model.parameters() if p.requires_grad]
        self.names = [n for n, p in self.model.named_parameters() if p.requires_grad]
        if settings.optimizer == "sgd":
            self.optimizer: torch.optim.Optimizer = torch.optim.SGD(self.parameters, lr=settings.learning_rate,
                                                                    momentum=settings.momentum)
        elif settings.optimizer == "normalised_rmsprop":
            from .normalised_rmsprop import NormalisedRMSprop

            self.optimizer = NormalisedRMSprop(self.parameters, settings.learning_rate, settings.adam_beta2,
                                               settings.adam_eps)
        else:
            self.optimizer = torch.optim.Adam(self.parameters, lr=settings.learning_rate,
                                              betas=(settings.adam_beta1, settings.adam_beta2), eps=settings.adam_eps)
        self.average = WeightAverage(self.model)
        self.progress = Progress()
        self.writer = None
        self.bar: Any = None
        self._plotted = -math.inf
        self._checkpointed = -1  # the step of the last checkpoint written or restored
        last = group.on_main(lambda: run.checkpoints.open("last", log=self._log))
        if last is not None:
            self._restore(last["path"])
        elif group.is_main and run.metrics_path.is_file():
            run.truncate_metrics(0)  # records of a run killed before its first checkpoint

    def log(self, message: str) -> None:
        if self.bar is not None:
            self.bar.write(self._log, message)
        else:
            self._log(message)

    # -- checkpoints ------------------------------------------------------------------------------
    def _checkpoint(self, best: bool) -> None:
        """Write a checkpoint of the current step (every rank calls it; rank 0 writes)."""
        self._checkpointed = self.progress.step
        rng = {"cpu": torch.get_rng_state()}
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        rngs = self.group.gather(rng)
        task_tensors, task_info = self.task.state()
        if not self.group.is_main:
            return
        tensors: dict[str, Tensor] = {}
        for rank, generators in enumerate(rngs):  # rank 0's as a one-process run names them
            tensors.update({f"rng.{kind}{f'.rank{rank}' if rank else ''}": v for kind, v in generators.items()})
        for name, p in zip(self.names, self.parameters):
            for key, value in self.optimizer.state.get(p, {}).items():  # Adam's moments, SGD's momentum buffer
                if value is not None:
                    tensors[f"adam.{name}.{key}"] = torch.as_tensor(value)
        tensors.update({f"task.{k}": v for k, v in task_tensors.items()})
        groups = {"model": self.model.state_dict(), "training": tensors}
        if self.average.active:
            groups["averaged"] = self.average.weights()
        state = {"progress": asdict(self.progress), "averaged_count": self.average.count, "task": task_info,
                 "world_size": self.group.world_size, "run_id": self.run.run_id()}
        directory = self.run.checkpoints.write(self.progress.step, groups, state)
        if best:  # before last: a kill between the two resumes from the older last and moves best again
            weights = "averaged" if self.average.active else "model"
            self.run.checkpoints.point("best", directory, step=self.progress.step, tokens=self.progress.tokens,
                                       weights=weights,
                                       valid_xent=self.progress.best_xent)
        self.run.checkpoints.point("last", directory, step=self.progress.step, tokens=self.progress.tokens)
        self.run.checkpoints.prune()

    def _restore(self, directory: Path) -> None:
        state = load_state(directory)
        self.progress = Progress(**state["progress"])
        self.model.load_state_dict(load_group(directory, "model", self.device))
        training = load_group(directory, "training")
        adam: dict[int, dict[str, Tensor]] = {}
        for index, name in enumerate(self.names):
            prefix = f"adam.{name}."
            entry = {k[len(prefix):]: v for k, v in training.items() if k.startswith(prefix)}
            if entry:
                adam[index] = {k: (v if k == "step" else v.to(self.device)) for k, v in entry.items()}
        self.optimizer.load_state_dict({"state": adam, "param_groups": self.optimizer.state_dict()["param_groups"]})
        self.task.load_state({k[5:]: v.to(self.device) for k, v in training.items() if k.startswith("task.")},
                             state.get("task", {}))
        if self.progress.averaging_since is not None:
            self.average.load(load_group(directory, "averaged", self.device), state["averaged_count"],
                              self.progress.averaging_since)
        suffix = f".rank{self.group.rank}" if self.group.rank else ""
        if f"rng.cpu{suffix}" in training:  # a rank the checkpoint did not have keeps its own fresh stream
            torch.set_rng_state(training[f"rng.cpu{suffix}"])
        if f"rng.cuda{suffix}" in training and self.device.type == "cuda":
            torch.cuda.set_rng_state(training[f"rng.cuda{suffix}"], self.device)
        self._checkpointed = self.progress.step
        if self.group.is_main:
            self.run.truncate_metrics(self.progress.step)
        saved = state.get("world_size", 1)
        processes = "" if saved == self.group.world_size else (
            f" (checkpointed by {saved} process{'es' * (saved > 1)}, resumed by {self.group.world_size}: the same "
            "global stripes and carried state; dropout masks are drawn afresh)")
        self._log(f"resuming {self.run.path} from step {self.progress.step}{processes}")

    def best_weights(self) -> dict[str, Tensor]:
        """The weights that scored best on validation (averaged ones once averaging started)."""
        pointer = self.run.checkpoints.open("best")
        if pointer is None:
            raise MoglmError(f"{self.run.path}: no best checkpoint yet")
        return load_group(pointer["path"], pointer.get("weights", "model"), self.device)

    # -- one step ---------------------------------------------------------------------------------
    def _diverged(self, step: int, what: str) -> TrainingDiverged:
        pointer = self.run.checkpoints.pointer("last")
        kept = f"the last good checkpoint (step {pointer['step']}) is kept" if pointer else "no checkpoint was written"
        return TrainingDiverged(f"non-finite {what} at step {step}; training stopped and {kept}")

    def _graphs(self):
        """Where the engine runs the model (steps, validations): with CUDA graphs when :attr:`graphed` (the
        settings' ``cuda_graphs`` resolved on this device), their lines above the progress bar."""
        if not self.graphed:
            return contextlib.nullcontext()
        return cuda_graphs.graphs(log=self.log, asked=bool(self.settings.cuda_graphs))

    def _step(self, step: int) -> tuple[float, int, float]:
        """One optimizer step; returns (summed nll, scored tokens, gradient norm before clipping). With CUDA
        graphs (:meth:`_graphs`) the recurrent layers' windows replay as graphs (forward and backward)."""
        with self._graphs():
            return self._step_now(step)

    def _step_now(self, step: int) -> tuple[float, int, float]:
        s = self.settings
        self.model.train()
        out = self.task.loss(step)
        summed, tokens, finite = float(out.summed.detach()), out.tokens, bool(torch.isfinite(out.summed))
        if self.group.distributed:  # the global loss, and one decision for every rank
            summed, tokens, bad = self.group.sum([summed if finite else 0.0, tokens, not finite])
            tokens, finite = int(tokens), not bad
        if not finite:
            raise self._diverged(step, "loss")
        loss = out.summed / out.sequences * self.group.world_size  # DDP averages the ranks' gradients
        if s.l2_penalty:
            loss = loss + s.l2_penalty * 0.5 * sum(p.pow(2).sum() for p in self.parameters)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.parameters, s.clip_norm)
        if not torch.isfinite(norm):
            raise self._diverged(step, "gradient")
        for group in self.optimizer.param_groups:
            group["lr"] = s.learning_rate_at(step)
        self.optimizer.step()
        self.average.update()
        return summed, tokens, float(norm)

    # -- evaluation during training -----------------------------------------------------------------
    def evaluation_model(self) -> nn.Module:
        """The weights validation scores: the running average once averaging started."""
        return self.average.evaluation_model()

    def _evaluate_and_checkpoint(self) -> bool:
        """Validation, best/averaging/early-stopping bookkeeping, checkpoint. Returns whether to stop."""
        s, p = self.settings, self.progress
        model = self.evaluation_model()
        with self._graphs():
            scores = self.group.on_main(lambda: self.task.validate(model))  # on rank 0, its scores on every rank
        improved = p.best_xent is None or scores["xent"] < p.best_xent
        if improved:
            p.best_xent, p.best_step, p.evals_without_improvement = scores["xent"], p.step, 0
        else:
            p.evals_without_improvement += 1
        if self.group.is_main:
            self.run.append_metrics({"kind": "valid", "step": p.step, "tokens": p.tokens, **scores,
                                     "averaged": self.average.active, "best": improved})
        for key, value in scores.items():
            self._scalar(f"valid/{key}", value, p.step)
        averaged = " (averaged weights)" if self.average.active else ""
        best = " (best so far: checkpoint kept)" if improved else ""
        self.log(f"step {p.step}: valid {self.task.describe(scores)}{averaged}{best}")
        if (not self.average.active and s.averaging_patience is not None
                and p.evals_without_improvement >= s.averaging_patience):
            self._start_averaging("validation stopped improving")
        stop = (s.early_stopping_patience is not None and p.evals_without_improvement >= s.early_stopping_patience
                and (self.average.active or s.averaging_patience is None))
        p.stopped_early = stop
        p.finished = stop or p.step >= s.steps
        self._checkpoint(best=improved)
        if self.group.is_main and (p.finished or time.monotonic() - self._plotted > 30):  # at most twice a minute
            plot_learning_curve(self.run.read_metrics(), self.run.plot_path, title=self.title, unit=self.unit,
                                averaging_since=p.averaging_since)
            self._plotted = time.monotonic()
        if self.on_evaluation is not None:
            self.on_evaluation(Evaluation(p.step, scores, model, improved))
        return stop

    def _start_averaging(self, why: str) -> None:
        self.average.start(self.progress.step)
        self.progress.averaging_since = self.progress.step
        self.progress.evals_without_improvement = 0
        self.log(f"step {self.progress.step}: weight averaging starts ({why})")

    def _scalar(self, tag: str, value: Any, step: int) -> None:
        if self.writer is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
            self.writer.add_scalar(tag, value, step)

    # -- the loop ---------------------------------------------------------------------------------
    def fit(self) -> Progress:
        """Run (or resume) training to the end, holding the run directory's lock; returns the final progress."""
        with self.group.hold(self.run), self.group.peers():
            return self._fit()

    def _fit(self) -> Progress:
        s, p = self.settings, self.progress
        if p.finished:
            self._log(f"{self.run.path}: training already finished at step {p.step}")
            return p
        self.writer = _tensorboard_writer(self.run) if self.group.is_main else None
        self.bar = progress_bar(s.steps, self.desc, s.tokens_per_step, self.progress_enabled, initial=p.step)
        log_every = max(1, min(s.log_every, s.eval_every))
        window_start = time.perf_counter()
        session_start, seconds_before = time.perf_counter(), p.seconds
        try:
            with _InterruptFlag() as interrupt:
                while p.step < s.steps:
                    step = p.step + 1
                    if (not self.average.active and s.averaging_start is not None
                            and step > s.averaging_start * s.steps):
                        self._start_averaging(f"{s.averaging_start:.0%} of training")
                    summed, tokens, norm = self._step(step)
                    p.step, p.tokens = step, p.tokens + tokens
                    p.window_nll += summed
                    p.window_tokens += tokens
                    p.seconds = seconds_before + time.perf_counter() - session_start
                    self.bar.update(1)
                    if step % log_every == 0 or step == s.steps:
                        self._record_training(step, norm, time.perf_counter() - window_start)
                        window_start = time.perf_counter()
                    if step % s.eval_every == 0 or step == s.steps:
                        if self._evaluate_and_checkpoint():
                            self.log(f"step {step}: early stopping")
                            break
                    if self.on_step is not None:
                        self.on_step(step)
                    stop = interrupt.set
                    if self.group.distributed:  # a signal to any rank stops every rank at this step
                        anywhere = self.group.sum([stop is not None])[0]  # every rank takes part, signalled or not
                        stop = stop or ("interrupted" if anywhere else None)
                    if stop:
                        if self._checkpointed != step:
                            self._checkpoint(best=False)
                        raise TrainingInterrupted(
                            f"{stop} at step {step}; checkpoint saved, rerun the same command to resume"
                            if self.group.is_main else "")
            if self.writer is not None and self.hparams:
                self.writer.add_hparams(self.hparams, {"hparam/best_valid_xent": p.best_xent or math.nan},
                                        run_name=".")
        finally:
            self.bar.close()
            self.bar = None
            if self.writer is not None:
                self.writer.close()
        return p

    def _record_training(self, step: int, norm: float, elapsed: float) -> None:
        p = self.progress
        xent = p.window_nll / max(p.window_tokens, 1)
        rate = p.window_tokens / max(elapsed, 1e-9)
        lr = self.optimizer.param_groups[0]["lr"]
        if not self.group.is_main:
            p.window_nll, p.window_tokens = 0.0, 0
            return
        self.run.append_metrics({"kind": "train", "step": step, "tokens": p.tokens, "xent": xent, "grad_norm": norm,
                                 "tokens_per_s": rate, "learning_rate": lr, "averaging": self.average.active})
        for tag, value in (("train/xent", xent), ("train/grad_norm", norm), ("train/tokens_per_s", rate),
                           ("train/learning_rate", lr)):
            self._scalar(tag, value, step)
        describe = getattr(self.task, "describe_training", None)  # the validation lines' unit, where it has one
        self.bar.set_postfix_str(f"train {describe(xent)}" if describe else f"xent {xent:.3f}")
        p.window_nll, p.window_tokens = 0.0, 0


def flat_hparams(mapping: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as TensorBoard's flat hyperparameters (``model.cell.rounds``); values that are not
    numbers, strings or booleans become strings, ``None`` is left out."""
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, dict):
            flat.update(flat_hparams(value, f"{prefix}{key}."))
        elif value is not None:
            flat[f"{prefix}{key}"] = value if isinstance(value, (int, float, str, bool)) else str(value)
    return flat


def _tensorboard_writer(run: RunDirectory):
    """A TensorBoard SummaryWriter in the run's ``tensorboard/`` when tensorboard is installed, else ``None``."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(run.path / "tensorboard"))
