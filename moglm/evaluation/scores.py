"""Language-modelling scores from a summed negative log-likelihood (docs/method.md, "Evaluation")."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

# unit: (name, how a score is written, nats/token -> the unit)
UNITS: dict[str, tuple[str, Callable[[float], str], Callable[[float], float]]] = {
    "nats": ("cross-entropy (nats / token)", lambda v: f"{v:.4f} nats", lambda x: x),
    "bits": ("bits per token", lambda v: f"{v:.4f} bits", lambda x: x / math.log(2)),
    "bpc": ("bits per character", lambda v: f"{v:.4f} bpc", lambda x: x / math.log(2)),
    "bpb": ("bits per byte", lambda v: f"{v:.4f} bpb", lambda x: x / math.log(2)),
    "perplexity": ("perplexity (log scale)", lambda v: f"ppl {v:.2f}", lambda x: math.exp(min(x, 700.0))),
}
#: the unit every score of a corpus is printed in, by ``data.format``: the one place that chooses it
FORMAT_UNITS = {"word": "perplexity", "char": "bpc", "ptb_char": "bpc", "byte": "bpb"}


def unit_for(data_format: str) -> str:
    """The unit of a corpus of ``data.format`` (``word``: perplexity, ``byte``: bits per byte, otherwise bits
    per character)."""
    return FORMAT_UNITS.get(data_format, "bpc")


def in_unit(xent: float, data_format: str) -> str:
    """A cross-entropy (nats per token) in its corpus's unit: ``ppl 56.70``, ``1.2345 bpc`` or ``1.2345 bpb``."""
    _, written, convert = UNITS[unit_for(data_format)]
    return written(convert(xent))


@dataclass
class Scores:
    """``nll``: summed negative log-likelihood in nats over ``tokens`` predictions; ``words``: the words
    those tokens spell (for bits per word of character models), when known."""

    nll: float
    tokens: int
    words: int | None = None
    characters: int | None = None  # the characters and bytes of the text those tokens spell, when known:
    bytes: int | None = None  # models with different tokenisers compare per character or byte (thesis 6.3.2)

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

    @property
    def bits_per_character(self) -> float | None:
        return None if not self.characters else self.nll / math.log(2) / self.characters

    @property
    def bits_per_byte(self) -> float | None:
        return None if not self.bytes else self.nll / math.log(2) / self.bytes

    def as_dict(self) -> dict[str, float | int | None]:
        d = {
            "xent": self.xent,
            "perplexity": self.perplexity,
            "bits_per_token": self.bits_per_token,
            "bits_per_word": self.bits_per_word,
            "tokens": self.tokens,
        }
        if self.characters:
            d |= {"bits_per_character": self.bits_per_character, "characters": self.characters}
        if self.bytes:
            d |= {"bits_per_byte": self.bits_per_byte, "bytes": self.bytes}
        return d

    def headline(self, level: str) -> str:
        """The number people quote, in the corpus's unit (:func:`in_unit`; word corpora with the cross-entropy
        beside it); a text scored by a subword model: per token, character and byte."""
        if self.characters:
            return (f"{self.bits_per_token:.4f} bits/token (ppl {self.perplexity:.2f}), "
                    f"{self.bits_per_character:.4f} bpc, {self.bits_per_byte:.4f} bpb")
        score = in_unit(self.xent, level)
        return f"{score} (xent {self.xent:.4f})" if unit_for(level) == "perplexity" else score


def unit(level: str) -> str:
    """The unit a corpus level is reported in: perplexity for words, bits per byte or character, and a music
    run's log-likelihood per frame."""
    return {"word": "perplexity", "byte": "bits per byte",
            "music": "log-likelihood per frame (nats)"}.get(level, "bits per character")
