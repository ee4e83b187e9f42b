"""Language-modelling scores from a summed negative log-likelihood (docs/method.md, "Evaluation")."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class Scores:
    """``nll``: summed negative log-likelihood in nats over ``tokens`` predictions; ``words``: the words
    those tokens spell (for bits per word of character models), when known."""

    nll: float
    tokens: int
    words: int | None = None

    @property
    def xent(self) -> float:
        """Cross-entropy per token, in nats."""
        return self.nll / max(self.tokens, 1)

    @property
    def perplexity(self) -> float:
        return math.exp(min(self.xent, 700.0))

    @property
    def bits_per_token(self) -> float:
        """Bits per character (or byte) for character-level models."""
        return self.xent / math.log(2)

    @property
    def bits_per_word(self) -> float | None:
        return None if not self.words else self.nll / math.log(2) / self.words

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "xent": self.xent,
            "perplexity": self.perplexity,
            "bits_per_token": self.bits_per_token,
            "bits_per_word": self.bits_per_word,
            "tokens": self.tokens,
        }

    def headline(self, level: str) -> str:
        """The number people quote: perplexity for word models, bits per character/byte otherwise."""
        if level == "word":
            return f"ppl {self.perplexity:.2f} (xent {self.xent:.4f})"
        unit = "bpb" if level == "byte" else "bpc"
        bpw = f", {self.bits_per_word:.3f} bits/word" if self.bits_per_word else ""
        return f"{self.bits_per_token:.4f} {unit}{bpw}"
