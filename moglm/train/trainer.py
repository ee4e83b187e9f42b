"""Training a language model from a :class:`RunConfig`: the language-model task of the training engine
(:mod:`moglm.train.engine`), and :func:`train_and_evaluate`, the one "train, then evaluate" every
command uses.

The language-model task follows the Mogrifier paper's recipe (section 3.3; docs/method.md, "Training
recipe"): non-episodic batches with the final state carried to the next window and each row's state reset
with probability ``state_reset_probability``, or episodic (padded, masked) batches; validation on the
stream (or the episodes) with ``train.eval_tokens`` tokens. The resets of step s, and the order of
episodes in epoch e, are drawn from generators seeded by s and e (and ``train.seed``), so they do not
depend on the dropout masks drawn before them, nor on how many processes share the batch.

Under torchrun, every process runs the same command and trains its block of the batch's rows
(:mod:`moglm.distributed`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..data.batching import Batch, EpisodicBatches, StreamBatches
from ..data.corpus import Corpus
from ..atomic import atomic_write_text
from ..device import resolve_device
from ..evaluation.stream import evaluate_episodes, evaluate_stream
from ..model.language_model import LanguageModel, count_parameters
from ..sampling import NoStart, encode_prompt
from ..runs.build import build_model, check_fits, load_data, resolve_hidden_size
from ..runs.config import RunConfig, run_identity, without_added_defaults
from ..evaluation.scores import in_unit, unit_for
from .. import distributed
from ..distributed import SINGLE, Group
from .engine import Engine, Evaluation, Progress, Settings, StepLoss, TrainingDiverged, TrainingInterrupted
from ..runs.language_model import LanguageModelRun

__all__ = ["LanguageModelTask", "Trainer", "TrainingDiverged", "TrainingInterrupted", "total_steps",
           "train_and_evaluate"]


def total_steps(cfg: RunConfig) -> int:
    t = cfg.train
    return t.max_steps if t.max_tokens is None else max(1, math.ceil(t.max_tokens / (t.batch_size * t.bptt)))


def engine_settings(cfg: RunConfig) -> Settings:
    """The engine's settings from a run config's ``[train]`` section."""
    t = cfg.train
    return Settings(steps=total_steps(cfg), learning_rate=t.learning_rate, eval_every=t.eval_every, optimizer=t.optimizer,
                    schedule=t.learning_rate_schedule, min_learning_rate=t.min_learning_rate,
                    adam_beta1=t.adam_beta1, adam_beta2=t.adam_beta2, adam_eps=t.adam_eps, clip_norm=t.clip_norm, l2_penalty=t.l2_penalty,
                    averaging_patience=t.averaging_patience, averaging_start=t.averaging_start,
                    early_stopping_patience=t.early_stopping_patience, tokens_per_step=t.batch_size * t.bptt,
                    cuda_graphs=t.cuda_graphs)


class LanguageModelTask:
    """Next-token prediction on a corpus with the paper's batching (carried state, per-row resets).

    With a data-parallel ``group``, this process reads its block of rows of every global batch (its
    stream stripes, or its share of a batch's episodes) and carries the state of its stripes."""

    def __init__(self, cfg: RunConfig, corpus: Corpus, model: LanguageModel, device: torch.device,
                 group: Group = SINGLE) -> None:
        self.cfg, self.corpus, self.model, self.device, self.group = cfg, corpus, model, device, group
        t = cfg.train
        if cfg.data.episodic:
            self.batches: Any = EpisodicBatches(corpus["train"], corpus.separator_id(), t.batch_size,
                                                cfg.data.max_length)
        else:
            self.batches = StreamBatches(corpus["train"], t.batch_size, t.bptt)
            self.rows = group.rows(t.batch_size)  # this process's stripes
        self.nll = group.wrap(distributed.Nll(model)) if group.distributed else model.nll
        self.carried: Any = None  # the recurrent state of this process's stripes, carried to the next window

    # -- the loss -----------------------------------------------------------------------------------
    def _next_batch(self, step: int) -> tuple[Batch, int]:
        """This process's rows of step ``step``'s batch, and the global batch's number of rows."""
        index = (step - 1) % len(self.batches)
        if isinstance(self.batches, EpisodicBatches):
            if index == 0:
                epoch = (step - 1) // len(self.batches)
                generator = torch.Generator().manual_seed(distributed.step_seed(self.cfg.train.seed, -1 - epoch))
                self.batches.shuffle(generator)
            batch = self.batches[index]
            return self._episodes(batch).to(self.device), batch.inputs.shape[1]
        if index == 0:
            self.carried = None  # a new pass over the data starts from a zero state
        batch = self.batches[index]
        return Batch(batch.inputs[:, self.rows], batch.targets[:, self.rows]).to(self.device), batch.inputs.shape[1]

    def _episodes(self, batch: Batch) -> Batch:
        """This process's share of an episodic batch; a process left without a row scores one masked row."""
        if not self.group.distributed:
            return batch
        share = torch.arange(batch.inputs.shape[1]).tensor_split(self.group.world_size)[self.group.rank]
        if not len(share):
            return Batch(batch.inputs[:, :1], batch.targets[:, :1], torch.zeros_like(batch.mask[:, :1]))
        return Batch(batch.inputs[:, share], batch.targets[:, share], batch.mask[:, share])

    def _reset_rows(self, step: int) -> None:
        """Zero each row's carried state with probability ``state_reset_probability``
        (docs/method.md, "Training recipe"); the draws of all B rows come from a generator seeded by the
        step, and this process keeps its rows'."""
        if self.carried is None or isinstance(self.batches, EpisodicBatches):
            self.carried = None
            return
        generator = torch.Generator().manual_seed(distributed.step_seed(self.cfg.train.seed, step))
        draws = torch.rand(self.cfg.train.batch_size, generator=generator)[self.rows]  # [B / processes]
        keep = (draws >= self.cfg.train.state_reset_probability).to(self.device)
        states = (self.carried,) if isinstance(self.carried, Tensor) else self.carried
        reset = tuple(s * keep.view(1, -1, *[1] * (s.dim() - 2)).to(s.dtype) for s in states)  # each [L, B, ...]
        self.carried = reset[0] if isinstance(self.carried, Tensor) else reset

    def loss(self, step: int) -> StepLoss:
        batch, sequences = self._next_batch(step)
        self._reset_rows(step)
        nll, state = self.nll(batch.inputs, batch.targets, self.carried)  # [T, B]
        if batch.mask is not None:
            nll = nll * batch.mask
        if state is not None and not isinstance(self.batches, EpisodicBatches):
            self.carried = state.detach() if isinstance(state, Tensor) else tuple(s.detach() for s in state)
        return StepLoss(nll.sum(), batch.num_tokens, sequences)

    # -- validation -----------------------------------------------------------------------------------
    def validate(self, model: LanguageModel) -> dict[str, float]:
        t = self.cfg.train
        ids = self.corpus["valid"]
        if self.cfg.data.episodic:
            scores = evaluate_episodes(model, ids, self.corpus.separator_id(), t.eval_batch_size, t.eval_tokens)
        else:
            scores = evaluate_stream(model, ids, t.eval_batch_size, t.bptt, max_tokens=t.eval_tokens)
        return {"xent": scores.xent, "perplexity": scores.perplexity, "bits_per_token": scores.bits_per_token}

    def describe(self, scores: dict[str, float]) -> str:
        return in_unit(scores["xent"], self.corpus.format)

    def describe_training(self, xent: float) -> str:
        """The training loss in the validation lines' unit (the progress bar shows it)."""
        return in_unit(xent, self.corpus.format)

    # -- resumable state ------------------------------------------------------------------------------
    def state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        """The carried state of all B stripes (``[L, B, *]`` each, gathered from every process)."""
        tensors: dict[str, Tensor] = {}
        if self.carried is not None:
            carried = (self.carried,) if isinstance(self.carried, Tensor) else self.carried
            tensors.update({f"carried.{j}": self.group.concat(s, 1) for j, s in enumerate(carried)})
        if isinstance(self.batches, EpisodicBatches):
            tensors["episode_order"] = self.batches.order
        return tensors, {"carried_is_tensor": isinstance(self.carried, Tensor)}

    def load_state(self, tensors: dict[str, Tensor], info: dict[str, Any]) -> None:
        carried = [tensors[f"carried.{j}"][:, self.rows] for j in range(len(tensors)) if f"carried.{j}" in tensors]
        if carried:
            self.carried = carried[0] if info.get("carried_is_tensor") else tuple(carried)
        if "episode_order" in tensors:
            self.batches.order = tensors["episode_order"].cpu()


class Trainer:
    """Trains ``config`` in ``run_dir`` (resuming it when it holds a checkpoint of the same config).

    ``on_step(step)`` runs after every step; ``on_evaluation(Evaluation)`` after every checkpoint.
    ``group``: the processes training together (default: the torchrun job this process is part of, else
    this process alone); only rank 0 logs and writes."""

    def __init__(
        self,
        config: RunConfig,
        run_dir: str | Path,
        progress: bool = True,
        log: Callable[[str], None] = print,
        on_step: Callable[[int], None] | None = None,
        on_evaluation: Callable[[Evaluation], None] | None = None,
        group: Group | None = None,
    ) -> None:
        self.cfg = config
        self.run = LanguageModelRun(run_dir)
        self.on_step, self.on_evaluation = on_step, on_evaluation
        device = resolve_device(config.train.device)
        self.group = group or distributed.process_group(device)
        self.device = distributed.rank_device(device, self.group)
        self.progress_enabled, self.log = progress, (log if self.group.is_main else (lambda message: None))
        self.engine: Engine | None = None

    def _setup(self) -> Engine:
        cfg, group = self.cfg, self.group
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        torch.manual_seed(cfg.train.seed)

        def load() -> None:  # rank 0 checks the corpus and fills its cache; the others then read the cache
            self.corpus = load_data(self.run.with_own_tokenizer(cfg).data)  # resumed: the tokenizer it trained

        # the corpus and the model's size are checked before the run directory is made:
        # a config that cannot run leaves nothing behind, and the corrected one starts in the same directory
        group.on_main(load)
        if not group.is_main:
            load()
        vocab_size = len(self.corpus.vocab)
        hidden = resolve_hidden_size(cfg.model, vocab_size)
        check_fits(cfg.model, vocab_size, hidden, self.device)  # one line, not a machine out of memory
        self.model: LanguageModel = build_model(cfg.model, vocab_size, hidden).to(self.device)
        saved = without_added_defaults(json.loads(cfg.model_dump_json(exclude_none=True)))
        group.on_main(lambda: self.run.prepare(saved, "language-model", identity=run_identity))
        self.log(self.corpus.summary())
        if group.is_main and not self.run.vocab_path.is_file():
            atomic_write_text(self.run.vocab_path, self.corpus.vocab.to_json())
        if group.is_main and self.corpus.vocab.tokenizer is not None and not self.run.tokenizer_path.is_file():
            # the subword tokenizer on its own too, for `tokenizers` and data.tokenizer = "<run>/tokenizer.json"
            atomic_write_text(self.run.tokenizer_path, self.corpus.vocab.tokenizer.to_str(pretty=True))
        info = {"hidden_size": hidden, "embedding_size": self.model.embedding_size,
                "num_params": count_parameters(self.model), "vocab_size": vocab_size,
                "corpus_digest": self.corpus.digest()}
        if group.is_main:
            self.run.write_model_info(info)
        layers = f"{cfg.model.num_layers} layer{'s' * (cfg.model.num_layers > 1)}"
        self.log(f"model: {cfg.model.architecture}, {layers}, hidden {hidden}, embedding {self.model.embedding_size}: "
                 f"{info['num_params']:,} parameters")
        distributed.seed_rank(cfg.train.seed, group)
        self.task = LanguageModelTask(cfg, self.corpus, self.model, self.device, group)
        unit = unit_for(self.corpus.format)
        return Engine(self.task, engine_settings(cfg), self.run, device=self.device, title=cfg.name or self.run.path.name,
                      unit=unit, progress=self.progress_enabled, log=self.log, on_step=self.on_step,
                      on_evaluation=self.on_evaluation, hparams=cfg.model_dump(mode="json", exclude={"description"}),
                      group=group)

    def check_sample(self) -> None:
        """After training: one line saying why the config's sample cannot start, if it cannot (training never
        waits on the sample; ``moglm train`` then skips it)."""
        if self.cfg.sample.num_tokens:
            try:
                encode_prompt(self.corpus.vocab, self.cfg.sample.prompt)
            except NoStart as e:
                self.log(f"no sample after training: {e} (set sample.prompt)")

    def train(self) -> Progress:
        """Run (or resume) training to the end; returns the final progress."""
        with self.group.hold(self.run):  # before the config is written: a second trainer is refused at once
            self.engine = self._setup()
            return self.engine.fit()


def train_and_evaluate(
    config: RunConfig,
    run_dir: str | Path,
    *,
    splits: list[str] | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
    on_evaluation: Callable[[Evaluation], None] | None = None,
    write: bool = True,
) -> tuple[Progress, dict[str, Any]]:
    """Train ``config`` in ``run_dir`` (resuming it), then run the final evaluation of its best checkpoint
    (:func:`moglm.train.final_evaluation.evaluate_run`; ``splits`` default to ``evaluation.splits``).
    Returns the training progress and the results (written to ``results.json`` unless ``write`` is false).
    Under torchrun every process trains its share and rank 0 evaluates; every process gets the results."""
    from .final_evaluation import evaluate_run

    run = LanguageModelRun(run_dir)
    trainer = Trainer(config, run_dir, progress=progress, log=log, on_evaluation=on_evaluation)
    with trainer.group.hold(run):
        trained = trainer.train()
        results = trainer.group.on_main(lambda: evaluate_run(run, splits, progress=progress, log=log, write=write,
                                                             cuda_graphs=config.train.cuda_graphs))
        trainer.check_sample()  # logs on rank 0 only
    return trained, results
