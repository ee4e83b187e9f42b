"""Language-modelling scores from a summed negative log-likelihood (docs/method.md, "Evaluation")."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..data.corpus import TextSize


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
        """The number people quote, in the level's own unit (perplexity for word and subword models, bits per
        character or byte otherwise), then bits per byte where the text's bytes are known, the unit in which word,
        character, byte and subword models of one text compare."""
        if self.characters:  # a text scored by a subword model: per token, character and byte
            return (f"{self.bits_per_token:.4f} bits/token (ppl {self.perplexity:.2f}), "
                    f"{self.bits_per_character:.4f} bpc, {self.bits_per_byte:.4f} bpb")
        bpb = f", {self.bits_per_byte:.4f} bits/byte" if self.bytes and level != "byte" else ""
        if level == "word":
            return f"ppl {self.perplexity:.2f} (xent {self.xent:.4f}){bpb}"
        if level == "tokenizer":
            return f"ppl {self.perplexity:.2f} ({self.bits_per_token:.4f} bits/token){bpb}"
        unit = "bpb" if level == "byte" else "bpc"
        bpw = f", {self.bits_per_word:.3f} bits/word" if self.bits_per_word else ""
        return f"{self.bits_per_token:.4f} {unit}{bpw}{bpb}"


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
