"""The reverse copy task (Mogrifier paper, section 4.3 and figure 4): read tokens drawn uniformly from a
vocabulary, then, after a marker, write them in reverse order.

The model is the paper's encoder-decoder: an independent, unidirectional encoder and decoder (any moglm
architecture, the same for both), the decoder starting from the encoder's final state. The encoder
reads ``x_1 .. x_n``; the decoder reads the marker then ``x_n .. x_2`` (teacher forcing) and predicts
``x_n .. x_1``, so the whole sequence is ``x, marker, reversed(x)`` and the loss (cross-entropy) is
measured on the decoded part only. No dropout (the paper: overfitting is not an issue). Training uses the
paper's recipe (docs/method.md, "Training recipe"): Adam with beta1 = 0, the loss summed over the
sequence and averaged over the batch plus ``l2_penalty * 0.5 * sum(w^2)``, global-norm clipping at 10.

Data: the paper samples a fixed 500k-example training set; here every step draws a fresh batch from a
generator seeded by (seed, step), an unbounded training set that makes resuming exact without storing
data. Validation and test sets are fixed (their own seeds). Exact-sequence accuracy counts test
sequences whose every teacher-forced argmax is right, which is exactly when greedy decoding reproduces
the whole reversed sequence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..cells.initialisation import truncated_normal_
from ..errors import MoglmError
from ..model.language_model import embedding_size
from ..model.sizing import largest_hidden_size
from ..modules import ARCHITECTURES
from ..runs import RunDirectory
from ..train.engine import Engine, Settings, StatelessTask, StepLoss

_SPLIT_SEEDS = {"valid": 1 << 40, "test": (1 << 40) + 1}


@dataclass
class ReverseCopyConfig:
    """Task, model and training of one reverse-copy run (saved as ``config.json`` in the run directory)."""

    length: int = 20
    vocab_size: int = 100
    architecture: str = "mogrifier"
    num_layers: int = 1
    hidden_size: int | None = None
    num_params: int | None = 200_000
    input_embedding_ratio: float = 1.0
    cell: dict[str, Any] = field(default_factory=dict)
    batch_size: int = 64
    steps: int = 2000
    learning_rate: float = 0.003
    l2_penalty: float = 0.0
    clip_norm: float = 10.0
    eval_every: int = 200
    valid_examples: int = 1000
    test_examples: int = 1000
    seed: int = 1

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise MoglmError(f"architecture must be one of {sorted(ARCHITECTURES)}, got {self.architecture!r}")
        if (self.hidden_size is None) == (self.num_params is None):
            raise MoglmError("set exactly one of hidden_size and num_params")
        for name in ("length", "vocab_size", "num_layers", "batch_size", "steps", "eval_every"):
            if getattr(self, name) < 1:
                raise MoglmError(f"{name} must be >= 1, got {getattr(self, name)}")


def sample_sources(generator: torch.Generator, count: int, length: int, vocab_size: int) -> Tensor:
    """``count`` sequences of ``length`` tokens drawn uniformly from ``0..vocab_size-1``, ``[T, B]``."""
    return torch.randint(vocab_size, (length, count), generator=generator)  # [T, B]


def decoder_io(sources: Tensor, marker: int) -> tuple[Tensor, Tensor]:
    """Decoder inputs (the marker, then the reversed sources but the last) and targets (the reversed
    sources), both ``[T, B]``."""
    targets = sources.flip(0)  # [T, B]
    inputs = torch.cat([torch.full_like(targets[:1], marker), targets[:-1]])  # [T, B]
    return inputs, targets


class EncoderDecoder(nn.Module):
    """Encoder and decoder of one architecture, each with its own embedding; the decoder starts from the
    encoder's final state and a linear softmax layer predicts the tokens. Token ``vocab_size`` is the marker."""

    def __init__(self, vocab_size: int, hidden_size: int, architecture: str = "mogrifier", num_layers: int = 1,
                 cell: dict[str, Any] | None = None, input_embedding_ratio: float = 1.0) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.embedding_size = embedding_size(hidden_size, input_embedding_ratio)
        self.encoder_embedding = nn.Embedding(vocab_size, self.embedding_size)
        self.decoder_embedding = nn.Embedding(vocab_size + 1, self.embedding_size)
        make = ARCHITECTURES[architecture]
        self.encoder = make(self.embedding_size, hidden_size, num_layers, init="paper", **(cell or {}))
        self.decoder = make(self.embedding_size, hidden_size, num_layers, init="paper", **(cell or {}))
        self.output = nn.Linear(hidden_size, vocab_size)
        for embedding in (self.encoder_embedding, self.decoder_embedding):
            if not embedding.weight.is_meta:
                truncated_normal_(embedding.weight.data, std=self.embedding_size**-0.5)

    def forward(self, sources: Tensor, decoder_inputs: Tensor) -> Tensor:
        """Logits ``[T, B, V]`` of the decoded tokens, from ``sources`` and ``decoder_inputs`` (``[T, B]``)."""
        _, state = self.encoder(self.encoder_embedding(sources))  # final state, each [L, B, *]
        h, _ = self.decoder(self.decoder_embedding(decoder_inputs), state)  # [T, B, H]
        return self.output(h)  # [T, B, V]

    def loss(self, sources: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Per-token cross-entropy ``[T, B]`` of the decoded part, argmax predictions and targets (``[T, B]``)."""
        inputs, targets = decoder_io(sources, self.vocab_size)
        logits = self(sources, inputs)  # [T, B, V]
        nll = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view_as(targets)  # [T, B]
        return nll, logits.argmax(-1), targets


def build_model(cfg: ReverseCopyConfig) -> EncoderDecoder:
    """The encoder-decoder of ``cfg``, sized to ``num_params`` (largest hidden size that fits) when given."""

    def make(hidden: int) -> EncoderDecoder:
        return EncoderDecoder(cfg.vocab_size, hidden, cfg.architecture, cfg.num_layers, cfg.cell,
                              cfg.input_embedding_ratio)

    try:
        hidden = cfg.hidden_size or largest_hidden_size(cfg.num_params, make)
        return make(hidden)
    except (ValueError, TypeError) as e:
        raise MoglmError(f"model: {e}") from None


@torch.no_grad()
def evaluate(model: EncoderDecoder, sources: Tensor, batch_size: int = 500) -> dict[str, float]:
    """Cross-entropy per decoded token (nats), token accuracy and exact-sequence accuracy on ``sources`` ``[T, N]``."""
    was_training = model.training
    model.eval()
    nll_sum, correct, exact = 0.0, 0, 0
    try:
        for start in range(0, sources.shape[1], batch_size):
            nll, predicted, targets = model.loss(sources[:, start : start + batch_size])  # each [T, b]
            nll_sum += float(nll.double().sum())
            hits = predicted == targets  # [T, b]
            correct += int(hits.sum())
            exact += int(hits.all(0).sum())
    finally:
        model.train(was_training)
    n = sources.shape[1]
    return {"xent": nll_sum / sources.numel(), "token_accuracy": correct / sources.numel(),
            "sequence_accuracy": exact / n, "examples": n}


def _split(cfg: ReverseCopyConfig, split: str) -> Tensor:
    count = cfg.valid_examples if split == "valid" else cfg.test_examples
    generator = torch.Generator().manual_seed(cfg.seed * (1 << 42) + _SPLIT_SEEDS[split])
    return sample_sources(generator, count, cfg.length, cfg.vocab_size)  # [T, N]


class ReverseCopyTask(StatelessTask):
    """The engine's view of the task: a fresh batch per step (seeded by the step), validation on the
    fixed validation set."""

    def __init__(self, cfg: ReverseCopyConfig, model: EncoderDecoder) -> None:
        self.cfg, self.model = cfg, model
        self.valid = _split(cfg, "valid")  # [T, N]

    def loss(self, step: int) -> StepLoss:
        cfg = self.cfg
        generator = torch.Generator().manual_seed(cfg.seed * (1 << 42) + step)
        nll, _, _ = self.model.loss(sample_sources(generator, cfg.batch_size, cfg.length, cfg.vocab_size))  # [T, B]
        return StepLoss(nll.sum(), nll.numel(), cfg.batch_size)

    def validate(self, model: nn.Module) -> dict[str, float]:
        return evaluate(model, self.valid)


def run_reverse_copy(cfg: ReverseCopyConfig, run_dir: str | Path, progress: bool = True,
                     log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train (or resume) ``cfg`` in ``run_dir``, evaluate the best checkpoint on test, write ``results.json``
    (holding the run directory's lock throughout)."""
    run = RunDirectory(run_dir)
    with run.lock():
        return _train_and_test(cfg, run, progress, log)


def _train_and_test(cfg: ReverseCopyConfig, run: RunDirectory, progress: bool,
                    log: Callable[[str], None]) -> dict[str, Any]:
    run.prepare(asdict(cfg), "reverse-copy")
    torch.manual_seed(cfg.seed)
    model = build_model(cfg)
    num_params = sum(p.numel() for p in model.parameters())
    hidden = model.output.in_features
    run.write_json(run.model_info_path, {"hidden_size": hidden, "embedding_size": model.embedding_size,
                                         "num_params": num_params})
    log(f"reverse copy, length {cfg.length}, vocabulary {cfg.vocab_size}: {cfg.architecture} encoder and decoder, "
        f"hidden {hidden}, embedding {model.embedding_size}: {num_params:,} parameters")
    settings = Settings(cfg.steps, cfg.learning_rate, cfg.eval_every, clip_norm=cfg.clip_norm,
                        l2_penalty=cfg.l2_penalty, tokens_per_step=cfg.batch_size * cfg.length)
    engine = Engine(ReverseCopyTask(cfg, model), settings, run, progress=progress, desc="reverse copy", log=log,
                    hparams=asdict(cfg) | {"hidden_size": hidden, "num_params": num_params})
    trained = engine.fit()
    model.load_state_dict(engine.best_weights())
    results = {"task": {"name": "reverse_copy", **asdict(cfg)}, "hidden_size": hidden, "num_params": num_params,
               "best_step": trained.best_step, "train_seconds": trained.seconds,
               "splits": {s: evaluate(model, _split(cfg, s)) for s in ("valid", "test")}}
    run.write_json(run.results_path, results)
    test = results["splits"]["test"]
    log(f"test: cross-entropy {test['xent']:.4f} nats per token, {100 * test['sequence_accuracy']:.1f}% of sequences "
        f"exact, {100 * test['token_accuracy']:.1f}% of tokens")
    return results
