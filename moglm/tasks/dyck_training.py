"""Training a model on bounded Dyck-k and measuring its WCPA (the student report, sections 4.2, 5 and 6.2).

Two objectives, as in the report:

* ``closing`` (how the report trains its Dyck-RNN): wherever the next bracket closes, predict which of
  the k closing brackets it is; cross-entropy over the k closing brackets, summed over those positions.
  :class:`ClosingBracketModel` is embedding -> recurrent stack -> an affine map to k logits. For the
  Dyck-RNN it is the report's model: the frozen 1-d bracket embedding with H = m (or the learned 2-d
  one with H = 2m), no biases, and the affine map reading the top of the stack, ``h[0]``. Other
  architectures read all of h through a learned embedding of size H. Trained by
  :func:`moglm.tasks.loop.train_loop`.
* ``lm`` (how the report trains its natural-language models, "with teacher forcing"): a language model
  of the bracket corpus (``<eos>`` ends each sequence), one sequence per row, trained by
  :class:`moglm.train.Trainer` on the corpus written to ``run_dir/data``; for WCPA its next-token
  distribution is renormalised over the closing brackets.

The Dyck-RNN's push/pop gate weight starts at 0 (``g = 1/2`` for every bracket, ``zero_gate``): from a
random start its sign picks the basin, and a negative one (opening brackets pop, closing ones push) is
a local minimum that training does not leave (``benchmarks/synthetic_tasks.py`` measures it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data.vocabulary import Vocabulary
from ..errors import MoglmError
from ..model.language_model import LanguageModel
from ..model.sizing import largest_hidden_size
from ..modules import ARCHITECTURES
from ..modules_rnn import DyckRNN
from ..train.checkpoint import atomic_write_text
from ..train.config import RunConfig, apply_overrides, validate
from ..train.final_evaluation import evaluate_run
from ..train.run_directory import RunDirectory
from ..train.trainer import Trainer
from .dyck import SPLITS, DyckTask, bracket_tokens, prepare_corpus, read_sequences
from .loop import LoopSettings, prepare_run, train_loop
from .wcpa import WCPAResult, evaluate_wcpa, prediction_batch

OBJECTIVES = ("closing", "lm")


@dataclass
class DyckTraining:
    """The model and its training on a Dyck task. ``objective`` ``None`` means ``closing`` for the Dyck-RNN and
    ``lm`` otherwise; ``hidden_size`` ``None`` means m (2m with ``learned_embedding``) for the Dyck-RNN, else
    16, unless ``num_params`` sets a budget. ``batch_size`` counts sequences."""

    architecture: str = "dyck_rnn"
    objective: str | None = None
    learned_embedding: bool = False
    zero_gate: bool = True
    hidden_size: int | None = None
    num_params: int | None = None
    batch_size: int = 128
    steps: int = 1000
    learning_rate: float = 0.03
    eval_every: int = 250
    seed: int = 1

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise MoglmError(f"architecture must be one of {sorted(ARCHITECTURES)}, got {self.architecture!r}")
        if self.objective is None:
            self.objective = "closing" if self.architecture == "dyck_rnn" else "lm"
        if self.objective not in OBJECTIVES:
            raise MoglmError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if self.learned_embedding and (self.architecture, self.objective) != ("dyck_rnn", "closing"):
            raise MoglmError("the learned 2-d bracket embedding is the Dyck-RNN's, with the closing objective")
        if self.hidden_size is not None and self.num_params is not None:
            raise MoglmError("set at most one of hidden_size and num_params")


class ClosingBracketModel(nn.Module):
    """Predicts the closing bracket: ``inputs`` ``[T, B]`` (bracket ids, ``2k`` the start) -> log-probabilities
    of the k closing brackets ``[T, B, k]`` (the output at t is about bracket t, having read brackets < t)."""

    def __init__(self, num_types: int, hidden_size: int, architecture: str = "dyck_rnn",
                 learned_embedding: bool = False, zero_gate: bool = True) -> None:
        super().__init__()
        k = num_types
        dyck = architecture == "dyck_rnn"
        if dyck and not learned_embedding:
            table = torch.cat([DyckRNN.bracket_embedding(k).weight, torch.zeros(1, 1)])  # [2k + 1, 1]; start = 0
            self.embedding = nn.Embedding.from_pretrained(table, freeze=True)
        else:
            self.embedding = nn.Embedding(2 * k + 1, 2 if dyck else hidden_size)
        options = {"bias": False, "backend": "reference"} if dyck else {}  # the report's; no fused Dyck-RNN
        self.rnn = ARCHITECTURES[architecture](self.embedding.embedding_dim, hidden_size, 1, **options)
        if dyck and zero_gate and not self.rnn.weight_gate_l0.is_meta:
            with torch.no_grad():
                self.rnn.weight_gate_l0.zero_()
        self.read = 1 if dyck else hidden_size  # the top of the stack, or all of h
        self.readout = nn.Linear(self.read, k)

    def forward(self, inputs: Tensor) -> Tensor:
        h, _ = self.rnn(self.embedding(inputs))  # [T, B, H]
        return self.readout(h[..., : self.read]).log_softmax(-1)  # [T, B, k]


def _hidden_size(task: DyckTask, training: DyckTraining, build: Callable[[int], nn.Module] | None) -> int | None:
    if training.hidden_size is not None:
        return training.hidden_size
    if training.num_params is not None:
        return largest_hidden_size(training.num_params, build) if build else None
    if training.architecture == "dyck_rnn":
        return task.max_depth * (2 if training.learned_embedding else 1)
    return 16


def _train_closing(task: DyckTask, training: DyckTraining, run: RunDirectory, data: dict[str, list[list[int]]],
                   progress: bool, log: Callable[[str], None]) -> dict[str, Any]:
    k, t = task.num_types, training

    def build(hidden: int) -> ClosingBracketModel:
        return ClosingBracketModel(k, hidden, t.architecture, t.learned_embedding, t.zero_gate)

    torch.manual_seed(t.seed)
    model = build(_hidden_size(task, t, build))
    num_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    atomic_write_text(run.model_info_path, json.dumps({"hidden_size": model.rnn.hidden_size,
                                                       "num_params": num_params}, indent=1))
    log(f"closing-bracket prediction: {t.architecture}, hidden {model.rnn.hidden_size}, embedding "
        f"{model.embedding.embedding_dim}{' (frozen)' if not model.embedding.weight.requires_grad else ''}: "
        f"{num_params:,} trainable parameters")
    ids, closes, train = torch.arange(2 * k), torch.arange(k), data["train"]

    def step_loss(step: int) -> Tensor:
        generator = torch.Generator().manual_seed(t.seed * (1 << 32) + step)
        rows = torch.randint(len(train), (t.batch_size,), generator=generator).tolist()
        inputs, where, types, _ = prediction_batch([train[r] for r in rows], k, ids, 2 * k)
        log_probs = model(inputs)[where[:, 0], where[:, 1]]  # [N, k]
        return F.nll_loss(log_probs, types, reduction="sum") / t.batch_size

    def wcpa(split: str) -> WCPAResult:
        model.eval()
        return evaluate_wcpa(model, data[split], k, ids, 2 * k, closes, task.positions, batch_size=256)

    def validate() -> dict[str, float]:
        result = wcpa("valid")
        return {"xent": result.xent, "wcpa": result.wcpa, "accuracy": result.accuracy}

    settings = LoopSettings(t.steps, t.learning_rate, t.eval_every)
    state = train_loop(model, settings, run, step_loss, validate, progress, log, "dyck", t.batch_size)
    return {"hidden_size": model.rnn.hidden_size, "num_params": num_params, "best_step": state["best_step"],
            "train_seconds": state["seconds"], "wcpa": {s: wcpa(s).as_dict() for s in ("valid", "test")}}


def lm_wcpa(model: LanguageModel, vocab: Vocabulary, sequences: Sequence[Sequence[int]], task: DyckTask) -> WCPAResult:
    """WCPA of a language model of the bracket corpus (sequences read from ``<eos>``, as it was trained)."""
    tokens = bracket_tokens(task.num_types)
    missing = [t for t in tokens if t not in vocab.stoi]
    if missing or vocab.eos is None:
        raise MoglmError(f"the vocabulary lacks {missing or ['<eos>']}")
    ids = torch.tensor([vocab.stoi[t] for t in tokens])  # [2k]
    was_training = model.training
    model.eval()
    try:
        return evaluate_wcpa(lambda x: model.log_probs(x)[0], sequences, task.num_types, ids, vocab.stoi[vocab.eos],
                             ids[task.num_types :], task.positions)
    finally:
        model.train(was_training)


def lm_config(task: DyckTask, training: DyckTraining, run_dir: Path, overrides: Sequence[str] = ()) -> RunConfig:
    """The language-model run: episodic (one sequence per row), one layer, untied, no weight averaging."""
    t = training
    model: dict[str, Any] = {"architecture": t.architecture, "num_layers": 1, "tie_embeddings": False}
    if t.num_params is not None:
        model["num_params"] = t.num_params
    else:
        model["hidden_size"] = _hidden_size(task, t, None)
    data = {
        "name": f"dyck-k{task.num_types}-m{task.max_depth}-{t.architecture}",
        "data": {"path": str((run_dir / "data").resolve()), "format": "word", "episodic": True},
        "model": model,
        "train": {"batch_size": t.batch_size, "max_steps": t.steps, "learning_rate": t.learning_rate,
                  "eval_every": t.eval_every, "eval_batch_size": 64, "seed": t.seed, "averaging_patience": None,
                  "averaging_start": None},
        "evaluation": {"batch_size": 64},
        "sample": {"num_tokens": 0},
    }
    return validate(apply_overrides(data, list(overrides)), "dyck task")


def _train_lm(task: DyckTask, training: DyckTraining, run: RunDirectory, data: dict[str, list[list[int]]],
              overrides: Sequence[str], progress: bool, log: Callable[[str], None]) -> dict[str, Any]:
    def valid_wcpa(step: int, xent: float) -> None:  # WCPA beside every validation loss in metrics.jsonl
        result = lm_wcpa(trainer.average.evaluation_model(), trainer.corpus.vocab, data["valid"], task)
        run.append_metrics({"kind": "valid_wcpa", "step": step, "wcpa": result.wcpa, "accuracy": result.accuracy})
        log(f"step {step}: valid WCPA {100 * (result.wcpa or 0):.1f}%")

    trainer = Trainer(lm_config(task, training, run.path, overrides), run.path, progress=progress, log=log,
                      on_evaluation=valid_wcpa)
    trainer.train()
    results = evaluate_run(run, progress=progress, log=log, write=False)
    model, _, vocab = run.load_model("best")
    info = run.model_info()
    results.update(hidden_size=info["hidden_size"], num_params=info["num_params"],
                   wcpa={s: lm_wcpa(model, vocab, data[s], task).as_dict() for s in ("valid", "test")})
    return results


def run_dyck(task: DyckTask, training: DyckTraining, run_dir: str | Path, overrides: Sequence[str] = (),
             progress: bool = True, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Write the corpus to ``run_dir/data``, train (or resume) with ``training.objective``, measure WCPA on
    validation and test with the best checkpoint on validation, and write ``results.json``. ``overrides``
    (``section.key=value``) adjust the language model's run config (objective ``lm`` only)."""
    run = RunDirectory(run_dir)
    if overrides and training.objective != "lm":
        raise MoglmError("--set overrides a language model's run config; the closing objective has none")
    prepare_run(run, {"task": asdict(task), "training": asdict(training), "overrides": list(overrides)}, "Dyck")
    prepare_corpus(task, run.path / "data")
    data = {s: read_sequences(run.path / "data" / f"{s}.txt", task.num_types) for s in SPLITS}
    if training.objective == "closing":
        results = _train_closing(task, training, run, data, progress, log)
    else:
        results = _train_lm(task, training, run, data, overrides, progress, log)
    results = {"task": {"name": "dyck", **asdict(task)}, "training": asdict(training), **results}
    for split in ("valid", "test"):
        r = results["wcpa"][split]
        worst = min((b for b in r["buckets"] if b["count"] >= r["min_count"]), key=lambda b: b["accuracy"],
                    default={"distance": "-"})["distance"]
        log(f"{split}: WCPA {100 * (r['wcpa'] or 0):.1f}% (worst bucket: distance {worst}; {r['predictions']:,} "
            f"predictions, {100 * (r['accuracy'] or 0):.1f}% correct overall)")
    atomic_write_text(run.results_path, json.dumps(results, indent=1))
    return results
