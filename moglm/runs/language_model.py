"""A language model's run directory (``moglm train``): its typed config, its trained model, and using it from
Python: ``moglm.load_run(path)``.

::

    run = moglm.load_run("runs/default")
    run.score("def main():\n    return 0\n").bits_per_token
    print(run.sample("The ", num_tokens=200, temperature=0.8, seed=1))

The model is the run's best checkpoint (averaged weights when averaging ran), in eval mode; the softmax
temperature is the factor the final evaluation searched on validation, or 1 for a run that was never
evaluated.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from ..data.corpus import TextSize, text_bytes
from ..data.vocabulary import Vocabulary
from ..device import resolve_device
from ..errors import MoglmError
from ..evaluation.scores import Scores
from ..evaluation.stream import evaluate_stream
from ..model.language_model import LanguageModel
from ..sampling import encode_prompt, sample
from .build import build_model
from .config import RunConfig, validate
from .directory import RunDirectory


class LanguageModelRun(RunDirectory):
    """A :class:`~moglm.runs.RunDirectory` whose config is a :class:`RunConfig`."""

    def load_config(self) -> RunConfig:
        config = self.read_config()
        if config.get("kind") == "music":
            raise MoglmError(f"{self.path} is a music run: use `moglm music evaluate`, `moglm music dyneval` or "
                             "`moglm sample`")
        return self.with_own_tokenizer(validate(config, str(self.config_path)))

    def with_own_tokenizer(self, config: RunConfig) -> RunConfig:
        """``config``, reading the corpus with the tokenizer this run trained (its ``tokenizer.json``) instead of
        training one again: a unigram tokenizer trained twice on the same text need not be the same."""
        data = config.data
        if data.tokenizer_training is None or not self.tokenizer_path.is_file():
            return config
        own = data.model_copy(update={"tokenizer": str(self.tokenizer_path), "tokenizer_training": None})
        return config.model_copy(update={"data": own})

    def logit_factor(self) -> float:
        """The logit factor (inverse softmax temperature) ``moglm evaluate`` found, from ``results.json``, else 1;
        a damaged file is a one-line error, not a silent 1."""
        if not self.results_path.is_file():
            return 1.0
        try:
            factor = json.loads(self.results_path.read_text()).get("temperature", 1.0)
            if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor) \
                    or factor <= 0:
                raise ValueError(f"temperature {factor!r}")
            return float(factor)
        except (ValueError, TypeError, AttributeError, UnicodeDecodeError) as e:
            raise MoglmError(f"{self.results_path}: damaged ({type(e).__name__}: {e}); run `moglm evaluate "
                             f"{self.path}` to write it again") from None

    def load_model(
        self, which: str = "best", device: torch.device | str = "cpu"
    ) -> tuple[LanguageModel, RunConfig, Vocabulary]:
        """The model of checkpoint ``which`` (``best``: the weights that scored best on validation,
        averaged if averaging was on; ``last``: the latest raw training weights)."""
        model, config, vocab = self._built()
        return self.load_weights(model, which).to(device), config, vocab

    def fresh_model(self, seed: int) -> tuple[LanguageModel, Vocabulary]:
        """The run's architecture and vocabulary with none of its weights: the model initialised as training
        initialises it, from torch's generator seeded with ``seed`` (the global generator left as it was)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model, _, vocab = self._built()
        return model.eval(), vocab

    def _built(self) -> tuple[LanguageModel, RunConfig, Vocabulary]:
        """The run's model as its config builds it (weights as initialised), its config and vocabulary."""
        config, vocab = self.load_config(), self.load_vocab()
        return build_model(config.model, len(vocab), self.model_info()["hidden_size"]), config, vocab


@dataclass
class TrainedRun:
    """A trained language model with its vocabulary and its tuned softmax temperature."""

    path: Path
    config: RunConfig
    model: LanguageModel
    vocab: Vocabulary
    temperature: float  # the logit factor of the final evaluation (1.0 when none was searched)

    def encode(self, text: str) -> torch.Tensor:
        """``text`` as token ids ``[N]``, preceded by the line separator the training lines end with
        (so the first token is scored in context, as in the corpus)."""
        return torch.tensor(encode_prompt(self.vocab, text), dtype=torch.long)

    def score(self, text: str, temperature: float | None = None) -> Scores:
        """How well the model predicts ``text`` (one stream, from a zero state): cross-entropy, perplexity,
        bits per token and bits per byte. ``temperature`` defaults to the run's tuned factor."""
        ids = self.encode(text).numpy()  # [N]
        if len(ids) < 2:
            raise MoglmError("score: the text has no token to predict")
        factor = self.temperature if temperature is None else temperature
        if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor > 0):
            raise MoglmError(f"score: the logit factor (temperature) must be a finite number > 0, got {factor!r}")
        # every token of the text is predicted (after the separator it is read after): all its bytes, as the
        # corpus counts them (a word model's text as its words spell it, without a newline the text does not end in)
        spelled = text_bytes("word", text) - (not text.endswith("\n")) if self.vocab.level == "word" else None
        size = TextSize(bytes=spelled if spelled is not None else len(text.encode("utf-8")))
        return evaluate_stream(self.model, ids, 1, self.config.train.bptt, factor, text=size)

    def sample(self, prompt: str = "", num_tokens: int = 200, temperature: float = 1.0, top_k: int | None = None,
               seed: int | None = None) -> str:
        """``prompt`` continued by ``num_tokens`` sampled tokens (``temperature`` divides the logits)."""
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
            raise MoglmError(f"sample: num_tokens must be an integer >= 0, got {num_tokens!r}")
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        return sample(self.model, self.vocab, prompt, num_tokens, temperature, top_k, generator)


def load_run(path: str | Path, checkpoint: str = "best", device: str | torch.device = "cpu") -> TrainedRun:
    """The trained model of the run directory ``path`` (see :class:`TrainedRun`). ``checkpoint`` is
    ``best`` or ``last``. Loading reads safetensors and JSON only; it never executes code."""
    run = LanguageModelRun(path)
    model, config, vocab = run.load_model(checkpoint, resolve_device(str(device)))
    model.eval()
    return TrainedRun(run.path, config, model, vocab, run.logit_factor())
