"""Training with the Mogrifier paper's recipe (section 3.3; docs/method.md "Training recipe").

* Adam with beta1 = 0 and a constant learning rate; the loss is the cross-entropy summed over the BPTT
  window and averaged over the batch, plus ``l2_penalty * 0.5 * sum(w^2)``; global-norm clipping.
* Non-episodic batches with the final state carried to the next window and each row's state reset
  with probability 0.01, or episodic (padded, masked) batches.
* Evaluation every K steps on validation; weight averaging after N evaluations without improvement or
  at 80% of training; best and last checkpoints; optional early stopping.

Reliability: every evaluation writes an atomic checkpoint holding everything the next step depends on
(weights, Adam moments, the average, the carried state, the random number generators, the position in
the data), so rerunning the same command after a kill continues exactly as the uninterrupted run
would. Ctrl-C saves a checkpoint at the current step first. A non-finite loss or gradient stops the run
before the weights are touched, keeping the last good checkpoint.
"""

from __future__ import annotations

import json
import math
import signal
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

from ..data.batching import EpisodicBatches, StreamBatches
from ..data.corpus import Corpus
from ..errors import MoglmError
from ..evaluation.scores import Scores
from ..evaluation.stream import evaluate_episodes, evaluate_stream
from ..model.language_model import LanguageModel, count_parameters
from ..progress import progress_bar
from .build import build_model, load_data, resolve_hidden_size
from .checkpoint import load_group
from .config import RunConfig
from .learning_curve import plot_learning_curve
from .run_directory import RunDirectory
from .weight_averaging import WeightAverage


class TrainingDiverged(MoglmError):
    """The loss or the gradient became NaN or infinite."""


class TrainingInterrupted(MoglmError):
    """Ctrl-C: a checkpoint was saved and the run can be resumed."""


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
    window_nll: float = 0.0  # the training loss summed since the last metrics record
    window_tokens: int = 0


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise MoglmError(f"train.device: unknown device {name!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise MoglmError(f"train.device is {name!r} but CUDA is not available")
    return device


def separator_id(corpus: Corpus) -> int:
    """The token that ends a line/sequence: ``<eos>``, or the newline character."""
    vocab = corpus.vocab
    for token in (vocab.eos, "\n"):
        if token is not None and token in vocab.stoi:
            return vocab.stoi[token]
    raise MoglmError("episodic mode needs <eos> or newline tokens in the vocabulary")


def total_steps(cfg: RunConfig) -> int:
    t = cfg.train
    return t.max_steps if t.max_tokens is None else max(1, math.ceil(t.max_tokens / (t.batch_size * t.bptt)))


class _InterruptFlag:
    """SIGINT sets a flag checked between steps (a second Ctrl-C interrupts at once)."""

    def __init__(self) -> None:
        self.set = False
        self._previous = None

    def __enter__(self) -> "_InterruptFlag":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.set:
            raise KeyboardInterrupt
        self.set = True

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


class Trainer:
    """Trains ``config`` in ``run_dir`` (resuming it when it holds a checkpoint of the same config)."""

    def __init__(
        self,
        config: RunConfig,
        run_dir: str | Path,
        progress: bool = True,
        log: Callable[[str], None] = print,
        on_step: Callable[[int], None] | None = None,
        on_evaluation: Callable[[int, float], None] | None = None,
    ) -> None:
        self.cfg = config
        self.run = RunDirectory(run_dir)
        self.progress_enabled = progress
        self.log = log
        self.on_step = on_step  # called after every completed step (tests use it to simulate kills)
        self.on_evaluation = on_evaluation  # called with (step, valid xent) after every checkpoint (pruning)
        self.device = resolve_device(config.train.device)
        self.max_steps = total_steps(config)
        self.writer = None
        self._plotted = -math.inf

    # -- set-up ---------------------------------------------------------------------------------
    def _setup(self) -> None:
        cfg = self.cfg
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        resuming = self.run.prepare(cfg)
        torch.manual_seed(cfg.train.seed)
        self.corpus = load_data(cfg.data)
        self.log(self.corpus.summary())
        if not self.run.vocab_path.is_file():
            self.run.vocab_path.write_text(self.corpus.vocab.to_json())
        vocab_size = len(self.corpus.vocab)
        hidden = resolve_hidden_size(cfg.model, vocab_size)
        self.model: LanguageModel = build_model(cfg.model, vocab_size, hidden).to(self.device)
        info = {
            "hidden_size": hidden,
            "embedding_size": self.model.embedding_size,
            "num_params": count_parameters(self.model),
            "vocab_size": vocab_size,
        }
        self.run.model_info_path.write_text(json.dumps(info, indent=1))
        self.log(
            f"model: {cfg.model.architecture}, {cfg.model.num_layers} layer{'s' * (cfg.model.num_layers > 1)}, hidden {hidden}, "
            f"embedding {self.model.embedding_size}: {info['num_params']:,} parameters"
        )
        t = cfg.train
        self.optimizer = torch.optim.Adam(
            self.model.parameters(), lr=t.learning_rate, betas=(0.0, t.adam_beta2), eps=t.adam_eps
        )
        self.average = WeightAverage(self.model)
        self.state: Any = None  # the carried recurrent state (non-episodic)
        self.progress = Progress()
        train_ids = self.corpus["train"]
        if cfg.data.episodic:
            self.batches: Any = EpisodicBatches(train_ids, separator_id(self.corpus), t.batch_size, cfg.data.max_length)
        else:
            self.batches = StreamBatches(train_ids, t.batch_size, t.bptt)
        if resuming:
            self._restore()
            self.log(f"resuming {self.run.path} from step {self.progress.step}")

    # -- checkpoints ------------------------------------------------------------------------------
    def _names(self) -> list[str]:
        return [n for n, _ in self.model.named_parameters()]

    def _training_tensors(self) -> dict[str, Tensor]:
        tensors: dict[str, Tensor] = {"rng.cpu": torch.get_rng_state()}
        if self.device.type == "cuda":
            tensors["rng.cuda"] = torch.cuda.get_rng_state(self.device)
        params = dict(self.model.named_parameters())
        for name, p in params.items():
            for key, value in self.optimizer.state.get(p, {}).items():
                tensors[f"adam.{name}.{key}"] = torch.as_tensor(value)
        if self.state is not None:
            carried = (self.state,) if isinstance(self.state, Tensor) else self.state
            for j, s in enumerate(carried):
                tensors[f"carried.{j}"] = s
        if isinstance(self.batches, EpisodicBatches):
            tensors["episode_order"] = self.batches.order
        return tensors

    def _checkpoint(self, best: bool) -> None:
        groups = {"model": self.model.state_dict(), "training": self._training_tensors()}
        if self.average.active:
            groups["averaged"] = self.average.weights()
        state = {"progress": asdict(self.progress), "carried_is_tensor": isinstance(self.state, Tensor),
                 "averaged_count": self.average.count}
        directory = self.run.checkpoints.write(self.progress.step, groups, state)
        self.run.checkpoints.point("last", directory, step=self.progress.step)
        if best:
            weights = "averaged" if self.average.active else "model"
            self.run.checkpoints.point("best", directory, step=self.progress.step, weights=weights,
                                       valid_xent=self.progress.best_xent)
        self.run.checkpoints.prune()

    def _restore(self) -> None:
        pointer = self.run.checkpoints.pointer("last")
        directory = pointer["path"]
        state = json.loads((directory / "state.json").read_text())
        self.progress = Progress(**state["progress"])
        self.model.load_state_dict(load_group(directory, "model", self.device))
        training = load_group(directory, "training")
        adam_state: dict[int, dict[str, Tensor]] = {}
        for index, name in enumerate(self._names()):
            entry = {k.rsplit(".", 1)[1]: v for k, v in training.items() if k.rsplit(".", 1)[0] == f"adam.{name}"}
            if entry:
                adam_state[index] = {k: (v if k == "step" else v.to(self.device)) for k, v in entry.items()}
        groups = self.optimizer.state_dict()["param_groups"]
        self.optimizer.load_state_dict({"state": adam_state, "param_groups": groups})
        carried = [training[f"carried.{j}"].to(self.device) for j in range(8) if f"carried.{j}" in training]
        if carried:
            self.state = carried[0] if state["carried_is_tensor"] else tuple(carried)
        if "episode_order" in training:
            self.batches.order = training["episode_order"]
        if self.progress.averaging_since is not None:
            self.average.load(load_group(directory, "averaged", self.device), state["averaged_count"],
                              self.progress.averaging_since)
        torch.set_rng_state(training["rng.cpu"])
        if "rng.cuda" in training and self.device.type == "cuda":
            torch.cuda.set_rng_state(training["rng.cuda"], self.device)
        self.run.truncate_metrics(self.progress.step)

    # -- one step ---------------------------------------------------------------------------------
    def _next_batch(self, step: int):
        n = len(self.batches)
        index = (step - 1) % n
        if index == 0:
            self.state = None  # a new pass over the data starts from a zero state
            if isinstance(self.batches, EpisodicBatches):
                self.batches.shuffle()
        return self.batches[index].to(self.device)

    def _reset_rows(self) -> None:
        """Zero each row's carried state with probability ``state_reset_probability``
        (docs/method.md, "Training recipe")."""
        p = self.cfg.train.state_reset_probability
        if self.state is None or isinstance(self.batches, EpisodicBatches):
            self.state = None
            return
        keep = (torch.rand(self.cfg.train.batch_size) >= p).to(self.device)  # [B]
        states = (self.state,) if isinstance(self.state, Tensor) else self.state
        reset = tuple(s * keep.view(1, -1, 1).to(s.dtype) for s in states)  # each [L, B, *]
        self.state = reset[0] if isinstance(self.state, Tensor) else reset

    def _l2(self) -> Tensor:
        return 0.5 * sum(p.pow(2).sum() for p in self.model.parameters())

    def _step(self, step: int) -> tuple[float, int, float]:
        """One optimizer step; returns (summed nll, scored tokens, gradient norm)."""
        t = self.cfg.train
        batch = self._next_batch(step)
        self._reset_rows()
        self.model.train()
        nll, state = self.model.nll(batch.inputs, batch.targets, self.state)  # [T, B]
        if batch.mask is not None:
            nll = nll * batch.mask
        summed = nll.sum()
        if not torch.isfinite(summed):
            raise TrainingDiverged(self._diverged(step, "loss"))
        loss = summed / batch.inputs.shape[1]
        if t.l2_penalty:
            loss = loss + t.l2_penalty * self._l2()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.clip_norm)
        if not torch.isfinite(norm):
            raise TrainingDiverged(self._diverged(step, "gradient"))
        self.optimizer.step()
        self.average.update()
        if state is not None and not isinstance(self.batches, EpisodicBatches):
            self.state = state.detach() if isinstance(state, Tensor) else tuple(s.detach() for s in state)
        return float(summed.detach()), batch.num_tokens, float(norm)

    def _diverged(self, step: int, what: str) -> str:
        pointer = self.run.checkpoints.pointer("last")
        kept = f"the last good checkpoint (step {pointer['step']}) is kept" if pointer else "no checkpoint was written"
        return f"non-finite {what} at step {step}; training stopped and {kept}"

    # -- evaluation during training -----------------------------------------------------------------
    def evaluate(self, model: LanguageModel, split: str = "valid", max_tokens: int | None = None) -> Scores:
        t = self.cfg.train
        ids = self.corpus[split]
        if self.cfg.data.episodic:
            return evaluate_episodes(model, ids, separator_id(self.corpus), t.eval_batch_size, max_tokens)
        return evaluate_stream(model, ids, t.eval_batch_size, t.bptt, max_tokens=max_tokens)

    def _evaluate_and_checkpoint(self) -> bool:
        """Validation, best/averaging/early-stopping bookkeeping, checkpoint. Returns whether to stop."""
        t, p = self.cfg.train, self.progress
        scores = self.evaluate(self.average.evaluation_model(), "valid", t.eval_tokens)
        self._last_valid_xent = scores.xent
        improved = p.best_xent is None or scores.xent < p.best_xent
        if improved:
            p.best_xent, p.best_step, p.evals_without_improvement = scores.xent, p.step, 0
        else:
            p.evals_without_improvement += 1
        record = {"kind": "valid", "step": p.step, "tokens": p.tokens, "xent": scores.xent,
                  "perplexity": scores.perplexity, "bits_per_token": scores.bits_per_token,
                  "averaged": self.average.active, "best": improved}
        self.run.append_metrics(record)
        self._tensorboard("valid/xent", scores.xent, p.step)
        averaged = " (averaged)" if self.average.active else ""
        self.log(f"step {p.step}: valid {scores.headline(self.corpus.format)}{averaged}{' *' if improved else ''}")
        if (not self.average.active and t.averaging_patience is not None
                and p.evals_without_improvement >= t.averaging_patience):
            self._start_averaging("validation stopped improving")
        stop = (t.early_stopping_patience is not None and p.evals_without_improvement >= t.early_stopping_patience
                and (self.average.active or t.averaging_patience is None))
        p.stopped_early = stop
        p.finished = stop or p.step >= self.max_steps
        self._checkpoint(best=improved)
        if p.finished or time.monotonic() - self._plotted > 30:  # redraw at most twice a minute
            plot_learning_curve(self.run.read_metrics(), self.run.plot_path, title=self.cfg.name or self.run.path.name)
            self._plotted = time.monotonic()
        return stop

    def _start_averaging(self, why: str) -> None:
        self.average.start(self.progress.step)
        self.progress.averaging_since = self.progress.step
        self.progress.evals_without_improvement = 0
        self.log(f"step {self.progress.step}: weight averaging starts ({why})")

    def _tensorboard(self, tag: str, value: float, step: int) -> None:
        if self.writer is not None:
            self.writer.add_scalar(tag, value, step)

    # -- the loop ---------------------------------------------------------------------------------
    def train(self) -> Progress:
        """Run (or resume) training to the end; returns the final progress."""
        self._setup()
        t, p = self.cfg.train, self.progress
        if p.finished:
            self.log(f"{self.run.path}: training already finished at step {p.step}")
            return p
        self.writer = _tensorboard_writer(self.run.path / "tensorboard")
        tokens_per_step = t.batch_size * t.bptt
        bar = progress_bar(self.max_steps, "train", tokens_per_step, self.progress_enabled, initial=p.step)
        window_start = time.perf_counter()
        log_every = max(1, min(10, t.eval_every))
        try:
            with _InterruptFlag() as interrupt:
                while p.step < self.max_steps:
                    step = p.step + 1
                    if (not self.average.active and t.averaging_start is not None
                            and step > t.averaging_start * self.max_steps):
                        self._start_averaging(f"{t.averaging_start:.0%} of training")
                    summed, tokens, norm = self._step(step)
                    p.step, p.tokens = step, p.tokens + tokens
                    p.window_nll += summed
                    p.window_tokens += tokens
                    bar.update(1)
                    if step % log_every == 0 or step == self.max_steps:
                        xent = p.window_nll / max(p.window_tokens, 1)
                        elapsed = time.perf_counter() - window_start
                        self.run.append_metrics({"kind": "train", "step": step, "tokens": p.tokens, "xent": xent,
                                                 "grad_norm": norm, "tokens_per_s": p.window_tokens / max(elapsed, 1e-9),
                                                 "averaging": self.average.active})
                        self._tensorboard("train/xent", xent, step)
                        bar.set_postfix_str(f"xent {xent:.3f}")
                        p.window_nll, p.window_tokens, window_start = 0.0, 0, time.perf_counter()
                    if step % t.eval_every == 0 or step == self.max_steps:
                        stop = self._evaluate_and_checkpoint()
                        if self.on_evaluation is not None:
                            self.on_evaluation(step, self._last_valid_xent)
                        if stop:
                            self.log(f"step {step}: early stopping")
                            break
                    if self.on_step is not None:
                        self.on_step(step)
                    if interrupt.set:
                        last = self.run.checkpoints.pointer("last")
                        if last is None or last["step"] != step:
                            self._checkpoint(best=False)
                        raise TrainingInterrupted(
                            f"interrupted at step {step}; checkpoint saved, rerun the same command to resume"
                        )
        finally:
            bar.close()
            if self.writer is not None:
                self.writer.close()
        return p


def _tensorboard_writer(path: Path):
    """A TensorBoard SummaryWriter when tensorboard is installed, else ``None``."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(path))
