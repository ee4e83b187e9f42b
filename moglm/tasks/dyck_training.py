"""Training a model on bounded Dyck-k and measuring its WCPA (the student report, sections 4.2, 5 and 6.2).

Two objectives, as in the report:

* ``closing`` (how the report trains its Dyck-RNN): wherever the next bracket closes, predict which of
  the k closing brackets it is; cross-entropy over the k closing brackets, summed over those positions.
  :class:`ClosingBracketModel` is embedding -> recurrent stack -> an affine map to k logits. For the
  Dyck-RNN it is the report's model: the frozen 1-d bracket embedding with H = m (or the learned 2-d
  one with H = 2m), no biases, and the affine map reading the top of the stack, ``h[0]``. Other
  architectures read all of h through a learned embedding of size H. Trained by the training engine
  (:mod:`moglm.train.engine`).
* ``lm`` (how the report trains its natural-language models, "with teacher forcing"): a language model
  of the bracket corpus (``<eos>`` ends each sequence), one sequence per row, trained by
  :func:`moglm.train.train_and_evaluate` on the corpus written to ``run_dir/data``; for WCPA its next-token
  distribution is renormalised over the closing brackets.

The Dyck-RNN's push/pop gate weight starts at 0 (``g = 1/2`` for every bracket, ``zero_gate``): from a
random start its sign picks the basin, and a negative one (opening brackets pop, closing ones push) is
a local minimum that training does not leave (``benchmarks/synthetic_tasks.py`` measures it).
"""

from __future__ import annotations

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
from ..modules import ARCHITECTURES, DyckRNN
from ..runs import RunDirectory
from ..runs.config import RunConfig, apply_overrides, validate
from ..train.engine import Engine, Evaluation, Settings, StatelessTask, StepLoss
from ..runs.language_model import LanguageModelRun
from ..train.trainer import train_and_evaluate
from .dyck import SPLITS, DyckTask, bracket_tokens, prepare_corpus, read_sequences
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
        options["init"] = "paper"
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


class ClosingBracketTask(StatelessTask):
    """The engine's view of the closing objective: step s trains on a batch of training sequences drawn
    with a generator seeded by s; validation is the cross-entropy and WCPA on the validation sequences."""

    def __init__(self, task: DyckTask, training: DyckTraining, model: ClosingBracketModel,
                 data: dict[str, list[list[int]]]) -> None:
        k = task.num_types
        self.task, self.training, self.model, self.data = task, training, model, data
        self.ids, self.closes = torch.arange(2 * k), torch.arange(k)

    def loss(self, step: int) -> StepLoss:
        k, t, train = self.task.num_types, self.training, self.data["train"]
        generator = torch.Generator().manual_seed(t.seed * (1 << 32) + step)
        rows = torch.randint(len(train), (t.batch_size,), generator=generator).tolist()
        inputs, where, types, _ = prediction_batch([train[r] for r in rows], k, self.ids, 2 * k)
        log_probs = self.model(inputs)[where[:, 0], where[:, 1]]  # [N, k]
        return StepLoss(F.nll_loss(log_probs, types, reduction="sum"), len(types), t.batch_size)

    def wcpa(self, model: nn.Module, split: str) -> WCPAResult:
        was_training = model.training
        model.eval()
        try:
            return evaluate_wcpa(model, self.data[split], self.task.num_types, self.ids, 2 * self.task.num_types,
                                 self.closes, self.task.positions, batch_size=256)
        finally:
            model.train(was_training)

    def validate(self, model: nn.Module) -> dict[str, float]:
        result = self.wcpa(model, "valid")
        return {"xent": result.xent, "wcpa": result.wcpa, "accuracy": result.accuracy}


def _train_closing(task: DyckTask, training: DyckTraining, run: RunDirectory, data: dict[str, list[list[int]]],
                   progress: bool, log: Callable[[str], None]) -> dict[str, Any]:
    k, t = task.num_types, training

    def build(hidden: int) -> ClosingBracketModel:
        return ClosingBracketModel(k, hidden, t.architecture, t.learned_embedding, t.zero_gate)

    torch.manual_seed(t.seed)
    model = build(_hidden_size(task, t, build))
    num_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    run.write_json(run.model_info_path, {"hidden_size": model.rnn.hidden_size, "num_params": num_params})
    log(f"closing-bracket prediction: {t.architecture}, hidden {model.rnn.hidden_size}, embedding "
        f"{model.embedding.embedding_dim}{' (frozen)' if not model.embedding.weight.requires_grad else ''}: "
        f"{num_params:,} trainable parameters")
    closing = ClosingBracketTask(task, t, model, data)
    settings = Settings(t.steps, t.learning_rate, t.eval_every, tokens_per_step=t.batch_size)
    engine = Engine(closing, settings, run, progress=progress, desc="dyck", log=log,
                    hparams={"task": asdict(task), "training": asdict(t)})
    trained = engine.fit()
    model.load_state_dict(engine.best_weights())
    return {"hidden_size": model.rnn.hidden_size, "num_params": num_params, "best_step": trained.best_step,
            "train_seconds": trained.seconds, "wcpa": {s: closing.wcpa(model, s).as_dict() for s in ("valid", "test")}}


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
    model: dict[str, Any] = {"architecture": t.architecture, "num_layers": 1, "tie_embeddings": False, "init": "paper"}
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
    lm_run = LanguageModelRun(run.path / "lm")

    def valid_wcpa(evaluation: Evaluation) -> None:  # WCPA beside every validation loss in metrics.jsonl
        result = lm_wcpa(evaluation.model, lm_run.load_vocab(), data["valid"], task)
        lm_run.append_metrics({"kind": "valid_wcpa", "step": evaluation.step, "wcpa": result.wcpa,
                            "accuracy": result.accuracy})
        log(f"step {evaluation.step}: valid WCPA {100 * (result.wcpa or 0):.1f}%")

    cfg = lm_config(task, training, run.path, overrides)
    _, results = train_and_evaluate(cfg, lm_run.path, progress=progress, log=log, on_evaluation=valid_wcpa)
    model, _, vocab = lm_run.load_model("best")
    info = lm_run.model_info()
    results.update(hidden_size=info["hidden_size"], num_params=info["num_params"],
                   wcpa={s: lm_wcpa(model, vocab, data[s], task).as_dict() for s in ("valid", "test")})
    return results


def run_dyck(task: DyckTask, training: DyckTraining, run_dir: str | Path, overrides: Sequence[str] = (),
             progress: bool = True, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Write the corpus to ``run_dir/data``, train (or resume) with ``training.objective`` (the ``lm``
    objective's language model is a run directory of its own, ``run_dir/lm``), measure WCPA on
    validation and test with the best checkpoint on validation, and write ``results.json``. ``overrides``
    (``section.key=value``) adjust the language model's run config (objective ``lm`` only)."""
    run = RunDirectory(run_dir)
    with run.lock():
        return _run_dyck(task, training, run, overrides, progress, log)


def _run_dyck(task: DyckTask, training: DyckTraining, run: RunDirectory, overrides: Sequence[str],
              progress: bool, log: Callable[[str], None]) -> dict[str, Any]:
    if overrides and training.objective != "lm":
        raise MoglmError("--set overrides a language model's run config; the closing objective has none")
    run.prepare({"task": asdict(task), "training": asdict(training), "overrides": list(overrides)}, "Dyck")
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
    run.write_json(run.results_path, results)
    return results
