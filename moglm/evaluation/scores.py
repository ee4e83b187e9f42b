"""Language-modelling scores from a summed negative log-likelihood (docs/method.md, "Evaluation")."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from ..data.corpus import TextSize

# unit: (name, how a score is written, nats/token -> the unit)
UNITS: dict[str, tuple[str, Callable[[float], str], Callable[[float], float]]] = {
    "nats": ("cross-entropy (nats / token)", lambda v: f"{v:.4f} nats", lambda x: x),
    "bits": ("bits per token", lambda v: f"{v:.4f} bits", lambda x: x / math.log(2)),
    "bpc": ("bits per character", lambda v: f"{v:.4f} bpc", lambda x: x / math.log(2)),
    "bpb": ("bits per byte", lambda v: f"{v:.4f} bpb", lambda x: x / math.log(2)),
    "perplexity": ("perplexity (log scale)", lambda v: f"ppl {v:.2f}", lambda x: math.exp(min(x, 700.0))),
}
#: the unit every score of a corpus is printed in, by ``data.format``: the one place that chooses it
FORMAT_UNITS = {"word": "perplexity", "tokenizer": "perplexity", "char": "bpc", "ptb_char": "bpc", "byte": "bpb"}


def unit_for(data_format: str) -> str:
    """The unit of a corpus of ``data.format`` (``word`` and ``tokenizer``: perplexity, ``byte``: bits per byte,
    otherwise bits per character)."""
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
        """The number people quote, in the corpus's unit (:func:`in_unit`; word and subword corpora with the
        cross-entropy beside it), then bits per byte where the text's bytes are known, the unit in which word,
        character, byte and subword models of one text compare. A text scored by a subword model of another
        vocabulary: per token, character and byte."""
        if self.characters:
            return (f"{self.bits_per_token:.4f} bits/token (ppl {self.perplexity:.2f}), "
                    f"{self.bits_per_character:.4f} bpc, {self.bits_per_byte:.4f} bpb")
        score = in_unit(self.xent, level)
        if unit_for(level) == "perplexity":
            score = f"{score} (xent {self.xent:.4f})"
        return f"{score}, {self.bits_per_byte:.4f} bits/byte" if adds_bits_per_byte(level, self.tokens, self.bytes) \
            else score


def adds_bits_per_byte(level: str, tokens: int | None, text_bytes: int | None) -> bool:
    """Whether a headline adds bits per byte: the text's bytes are known, and they are not the tokens scored
    (a byte model's own unit is bits per byte, unless its text was rewritten by ``data.detokenize``: then
    the bytes of the original text, the shared denominator, differ from the bytes it reads)."""
    return bool(text_bytes) and not (level == "byte" and text_bytes == tokens)


def scored(nll: float, predictions: int, tokens: int, text: TextSize | None) -> Scores:
    """The scores of ``predictions`` over a stream of ``tokens`` tokens whose text is ``text`` (the words and bytes
    in proportion to the predictions made, :meth:`~moglm.data.TextSize.scored`)."""
    share = TextSize() if text is None else text.scored(predictions, tokens)
    return Scores(nll, predictions, share.words, bytes=share.bytes)


def unit(level: str) -> str:
    """The unit a corpus level is reported in: perplexity for words and subword tokens, bits per byte or
    character, and a music run's log-likelihood per frame."""
    return {"word": "perplexity", "tokenizer": "perplexity", "byte": "bits per byte",
            "music": "log-likelihood per frame (nats)"}.get(level, "bits per character")
