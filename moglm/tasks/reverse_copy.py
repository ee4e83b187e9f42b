"""The reverse copy task (Mogrifier paper, section 4.3 and figure 4): read tokens drawn uniformly from a
vocabulary, then, after a marker, write them in reverse order.

The model is the paper's encoder-decoder: an independent, unidirectional encoder and decoder (any moglm
architecture, the same for both), the decoder starting from the encoder's final state. The encoder
reads ``x_1 .. x_n``; the decoder reads the marker then ``x_n .. x_2`` (teacher forcing) and predicts
``x_n .. x_1``, so the whole sequence is ``x, marker, reversed(x)`` and the loss (cross-entropy) is
measured on the decoded part only. No dropout (the paper: overfitting is not an issue). Training uses the
paper's recipe (docs/method.md, "Training recipe"): Adam with beta1 = 0, the loss summed over the
sequence and averaged over the batch plus ``l2_penalty * 0.5 * sum(w^2)``, global-norm clipping at 10.

Data. The paper's setup is a fixed training set of 500k examples, vocabulary 1k, validation and test
sets of 10k examples (``train_examples=500_000, vocab_size=1000, valid_examples=test_examples=10_000``).
Every random draw is a function of the seed, so resuming is exact without storing any data:

* ``train_examples=None`` (the default): every step draws a fresh batch from a generator seeded by
  (seed, step), an unbounded training set.
* ``train_examples=N``: a fixed training set of N examples. Example i's length and tokens come from a
  generator seeded by (seed, i) (generated when a batch needs it, so even 500k examples of length 200
  cost no memory); epoch e visits every example once, in an order drawn from (seed, e), so step s takes
  batch ``(s - 1) mod batches_per_epoch`` of epoch ``(s - 1) // batches_per_epoch``.
* Lengths: ``length`` (every sequence that long), or ``min_length``..``max_length`` (set both; they
  replace ``length``, which is then recorded as ``None``). Every batch holds sequences of ONE length:
  fresh batches draw the length uniformly per step; a fixed set is bucketed by length and each epoch
  cuts every bucket into batches (the last batch of a bucket may be smaller) and shuffles the batches.
  One length per batch needs no padding or masking, so the loss of every batch is exactly the paper's
  (summed over the sequence, averaged over the batch), and any architecture works unchanged.
* Validation and test sets are fixed (their own seeds) and cover the length range evenly: example j has
  length ``min_length + j mod (max_length - min_length + 1)``, each length's examples drawn together.

Evaluation (:func:`evaluate`) gives the cross-entropy per decoded token, token accuracy and
exact-sequence accuracy, overall and ``by_length`` (``{"50": {xent, token_accuracy, sequence_accuracy,
examples}, ...}``, keys as strings as in ``results.json``): figure 4 plots ``xent`` against length. The
overall cross-entropy is the token-weighted mean of the per-length ones (weights ``examples * length``).
Exact-sequence accuracy counts sequences whose every teacher-forced argmax is right, which is exactly
when greedy decoding reproduces the whole reversed sequence.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..cells.initialisation import truncated_normal_
from ..device import resolve_device
from ..errors import MoglmError
from ..model.language_model import embedding_size
from ..model.sizing import largest_hidden_size
from ..modules import ARCHITECTURES
from ..runs import RunDirectory
from ..train.engine import Engine, Evaluation, Settings, StatelessTask, StepLoss

# Offsets added to seed * 2**42, one per stream of random draws: the fresh batch of step s uses s itself.
_SPLIT_SEEDS = {"valid": 1 << 40, "test": (1 << 40) + 1}
_TRAIN_LENGTHS_SEED = (1 << 40) + 2
_EPOCH_SEED = 1 << 39  # + epoch
_EXAMPLE_SEED = 1 << 41  # + example index


@dataclass
class ReverseCopyConfig:
    """Task, model and training of one reverse-copy run (saved as ``config.json`` in the run directory)."""

    length: int | None = 20
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
    min_length: int | None = None  # with max_length: lengths drawn from min_length..max_length (replaces length)
    max_length: int | None = None
    train_examples: int | None = None  # a fixed training set of this many examples (None: fresh batches)

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise MoglmError(f"architecture must be one of {sorted(ARCHITECTURES)}, got {self.architecture!r}")
        if (self.hidden_size is None) == (self.num_params is None):
            raise MoglmError("set exactly one of hidden_size and num_params")
        if (self.min_length is None) != (self.max_length is None):
            raise MoglmError("set both min_length and max_length (or length alone)")
        if self.min_length is not None:
            self.length = None  # the range replaces it
        elif self.length is None:
            raise MoglmError("set length, or min_length and max_length")
        names = ("length", "min_length", "max_length", "vocab_size", "num_layers", "batch_size", "steps",
                 "eval_every", "valid_examples", "test_examples", "train_examples")
        for name in names:
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise MoglmError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.vocab_size < 2:  # one token to copy: every sequence is the same, nothing to learn or measure
            raise MoglmError(f"vocab_size must be >= 2 (with one token there is nothing to copy), got {self.vocab_size}")
        low, high = self.lengths
        if low > high:
            raise MoglmError(f"min_length ({low}) must be <= max_length ({high})")

    @property
    def lengths(self) -> tuple[int, int]:
        """The shortest and the longest sequence length (equal for a fixed ``length``)."""
        if self.min_length is not None and self.max_length is not None:
            return self.min_length, self.max_length
        assert self.length is not None
        return self.length, self.length

    @property
    def length_label(self) -> str:
        """``40`` or ``50-200``: the lengths in names and log lines."""
        low, high = self.lengths
        return str(low) if low == high else f"{low}-{high}"


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
def evaluate(model: EncoderDecoder, sources: Tensor | Sequence[Tensor], batch_size: int = 500) -> dict[str, Any]:
    """Cross-entropy per decoded token (nats), token accuracy and exact-sequence accuracy on ``sources``
    (``[T, N]``, or a list of such tensors of different lengths), overall and ``by_length``."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    totals: dict[int, list[float]] = {}  # length -> [nll sum, correct tokens, exact sequences, sequences]
    try:
        for bucket in [sources] if isinstance(sources, Tensor) else sources:
            total = totals.setdefault(bucket.shape[0], [0.0, 0, 0, 0])
            for start in range(0, bucket.shape[1], batch_size):
                nll, predicted, targets = model.loss(bucket[:, start : start + batch_size].to(device))  # [T, b]
                hits = predicted == targets  # [T, b]
                total[0] += float(nll.double().sum())
                total[1] += int(hits.sum())
                total[2] += int(hits.all(0).sum())
                total[3] += hits.shape[1]
    finally:
        model.train(was_training)

    def scores(nll: float, correct: float, exact: float, n: float, tokens: float) -> dict[str, Any]:
        return {"xent": nll / tokens, "token_accuracy": correct / tokens, "sequence_accuracy": exact / n,
                "examples": int(n)}

    by_length = {str(length): scores(*t, t[3] * length) for length, t in sorted(totals.items())}
    overall = [sum(t[i] for t in totals.values()) for i in range(4)]
    tokens = sum(t[3] * length for length, t in totals.items())
    return {**scores(*overall, tokens), "by_length": by_length}


def split_sources(cfg: ReverseCopyConfig, split: str) -> list[Tensor]:
    """The fixed validation or test set: one ``[T, n_T]`` tensor per length, the lengths covered evenly."""
    count = cfg.valid_examples if split == "valid" else cfg.test_examples
    generator = torch.Generator().manual_seed(cfg.seed * (1 << 42) + _SPLIT_SEEDS[split])
    low, high = cfg.lengths
    span = high - low + 1
    counts = [count // span + (i < count % span) for i in range(span)]
    return [sample_sources(generator, n, low + i, cfg.vocab_size) for i, n in enumerate(counts) if n]


def fresh_batch(cfg: ReverseCopyConfig, step: int) -> Tensor:
    """The batch of ``step`` when there is no fixed training set: a length drawn uniformly, then the tokens."""
    generator = torch.Generator().manual_seed(cfg.seed * (1 << 42) + step)
    low, high = cfg.lengths
    length = low if low == high else int(torch.randint(low, high + 1, (1,), generator=generator))
    return sample_sources(generator, cfg.batch_size, length, cfg.vocab_size)  # [T, B]


class TrainingSet:
    """The fixed training set of ``cfg.train_examples`` examples, generated on demand (see the module's
    docstring): example i from a generator seeded by (seed, i), epochs in orders seeded by (seed, epoch)."""

    def __init__(self, cfg: ReverseCopyConfig) -> None:
        assert cfg.train_examples is not None
        self.cfg, self.base = cfg, cfg.seed * (1 << 42)
        low, high = cfg.lengths
        generator = torch.Generator().manual_seed(self.base + _TRAIN_LENGTHS_SEED)
        self.lengths = torch.randint(low, high + 1, (cfg.train_examples,), generator=generator)  # [N]
        counts = torch.bincount(self.lengths - low)
        self.counts = [int(n) for n in counts if n]  # examples per length present, shortest first
        self.batches_per_epoch = sum(math.ceil(n / cfg.batch_size) for n in self.counts)
        self._epoch: tuple[int, list[Tensor]] | None = None

    def example(self, index: int) -> Tensor:
        """Example ``index``'s tokens, ``[T]``."""
        generator = torch.Generator().manual_seed(self.base + _EXAMPLE_SEED + index)
        return torch.randint(self.cfg.vocab_size, (int(self.lengths[index]),), generator=generator)

    def epoch(self, epoch: int) -> list[Tensor]:
        """Epoch ``epoch``'s batches (indices of examples of one length each), in training order."""
        if self._epoch is None or self._epoch[0] != epoch:
            generator = torch.Generator().manual_seed(self.base + _EPOCH_SEED + epoch)
            order = torch.randperm(len(self.lengths), generator=generator)
            order = order[torch.sort(self.lengths[order], stable=True).indices]  # by length, shuffled within
            batches = [b for bucket in order.split(self.counts) for b in bucket.split(self.cfg.batch_size)]
            shuffled = torch.randperm(len(batches), generator=generator).tolist()
            self._epoch = (epoch, [batches[i] for i in shuffled])
        return self._epoch[1]

    def batch(self, step: int) -> Tensor:
        """The batch of ``step`` (1-based), ``[T, b]``."""
        epoch, position = divmod(step - 1, self.batches_per_epoch)
        return torch.stack([self.example(int(i)) for i in self.epoch(epoch)[position]], 1)


class ReverseCopyTask(StatelessTask):
    """The engine's view of the task: the batch of each step (fresh, or from the fixed training set), and
    validation on the fixed validation set (overall scores only; ``by_length`` is in the results)."""

    def __init__(self, cfg: ReverseCopyConfig, model: EncoderDecoder) -> None:
        self.cfg, self.model = cfg, model
        self.valid = split_sources(cfg, "valid")
        self.training_set = TrainingSet(cfg) if cfg.train_examples is not None else None

    def batch(self, step: int) -> Tensor:
        """The training sources of ``step``, ``[T, b]`` (on the CPU)."""
        return self.training_set.batch(step) if self.training_set is not None else fresh_batch(self.cfg, step)

    def loss(self, step: int) -> StepLoss:
        sources = self.batch(step).to(next(self.model.parameters()).device)  # [T, b]
        nll, _, _ = self.model.loss(sources)  # [T, b]
        return StepLoss(nll.sum(), nll.numel(), sources.shape[1])

    def validate(self, model: nn.Module) -> dict[str, float]:
        scores = evaluate(model, self.valid)
        del scores["by_length"]
        return scores


def run_reverse_copy(cfg: ReverseCopyConfig, run_dir: str | Path, progress: bool = True,
                     log: Callable[[str], None] = print, *, device: str = "cpu",
                     splits: Sequence[str] = ("valid", "test"),
                     on_evaluation: Callable[[Evaluation], None] | None = None) -> dict[str, Any]:
    """Train (or resume) ``cfg`` in ``run_dir`` on ``device`` (``auto``, ``cpu``, ``cuda``, ...), evaluate the
    best checkpoint on ``splits``, write ``results.json`` (holding the run directory's lock throughout).
    ``on_evaluation`` is called after every validation during training (tuning reports and prunes with it)."""
    run = RunDirectory(run_dir)
    with run.lock():
        return _train_and_test(cfg, run, progress, log, resolve_device(device), tuple(splits), on_evaluation)


def _train_and_test(cfg: ReverseCopyConfig, run: RunDirectory, progress: bool, log: Callable[[str], None],
                    device: torch.device, splits: tuple[str, ...],
                    on_evaluation: Callable[[Evaluation], None] | None) -> dict[str, Any]:
    run.prepare(asdict(cfg), "reverse-copy")
    torch.manual_seed(cfg.seed)
    model = build_model(cfg).to(device)
    num_params = sum(p.numel() for p in model.parameters())
    hidden = model.output.in_features
    run.write_json(run.model_info_path, {"hidden_size": hidden, "embedding_size": model.embedding_size,
                                         "num_params": num_params})
    data = (f"a fixed training set of {cfg.train_examples:,} examples" if cfg.train_examples is not None
            else "a fresh batch every step")
    log(f"reverse copy, length {cfg.length_label}, vocabulary {cfg.vocab_size}, {data}: {cfg.architecture} encoder "
        f"and decoder, hidden {hidden}, embedding {model.embedding_size}: {num_params:,} parameters")
    low, high = cfg.lengths
    settings = Settings(cfg.steps, cfg.learning_rate, cfg.eval_every, clip_norm=cfg.clip_norm,
                        l2_penalty=cfg.l2_penalty, tokens_per_step=cfg.batch_size * (low + high) // 2)
    engine = Engine(ReverseCopyTask(cfg, model), settings, run, device=device, progress=progress,
                    desc="reverse copy", log=log, on_evaluation=on_evaluation,
                    hparams=asdict(cfg) | {"hidden_size": hidden, "num_params": num_params})
    trained = engine.fit()
    model.load_state_dict(engine.best_weights())
    results = {"task": {"name": "reverse_copy", **asdict(cfg)}, "hidden_size": hidden, "num_params": num_params,
               "best_step": trained.best_step, "train_seconds": trained.seconds,
               "splits": {s: evaluate(model, split_sources(cfg, s)) for s in splits}}
    run.write_json(run.results_path, results)
    for split, scores in results["splits"].items():
        log(f"{split}: cross-entropy {scores['xent']:.4f} nats per token, {100 * scores['sequence_accuracy']:.1f}% "
            f"of sequences exact, {100 * scores['token_accuracy']:.1f}% of tokens")
    return results
