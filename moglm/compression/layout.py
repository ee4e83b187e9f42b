"""A file as the model's tokens and the gaps between them, losslessly.

A character- or byte-level run predicts tokens; a file is bytes. The file is read as characters (UTF-8,
with bytes that are not UTF-8 kept as escape characters, so every file reads back to itself: Python's
``surrogateescape``), or as bytes (latin-1) for a byte-level run. Each character that is a token of the
vocabulary is coded by the model; every other character (a space between PTB-char symbols, a letter the
training text never had, a stray byte) goes into the *gap* before the next token, coded by a small
adaptive model (:mod:`.coder`). So::

    file = gaps[0] token[0] gaps[1] token[1] ... token[N-1] gaps[N]

For ``ptb_char`` runs (Mikolov's format: symbols separated by spaces, ``_`` between words) the newline is
the ``<eos>`` token and the separating spaces are the gaps; for plain ``char`` runs the gaps are almost
always empty, and a byte-level run has none (:attr:`Layout.gapless`). Word-level runs are refused: a word's
spelling is not recoverable from its id.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..data.vocabulary import Vocabulary
from ..errors import MoglmError

LEVELS = ("char", "ptb_char", "byte")


@dataclass(frozen=True)
class Layout:
    """Which character each token spells, for one vocabulary; :meth:`split` and :meth:`join` invert each other."""

    ids: dict[str, int]  # character -> token id
    chars: dict[int, str]  # token id -> character
    start: int  # the token the model reads before the first one (the line separator training lines end with)
    encoding: str  # how bytes read as characters: utf-8 with surrogateescape, or latin-1 (byte runs)
    separator: str = ""  # a character that is a gap by design (ptb_char's separating space), not a missing token

    @classmethod
    def of(cls, vocab: Vocabulary) -> "Layout":
        if vocab.level not in LEVELS:
            raise MoglmError(f"compression needs a character- or byte-level run ({', '.join(LEVELS)}); this run's "
                             f"vocabulary is {vocab.level}-level, whose tokens do not spell the text")
        ids = {t: i for t, i in vocab.stoi.items() if len(t) == 1 and t != vocab.unk}
        if vocab.eos is not None and "\n" not in ids:
            ids["\n"] = vocab.stoi[vocab.eos]
        if vocab.level == "ptb_char":
            ids.pop(" ", None)  # never a token of that format: spaces only separate symbols
        start = vocab.stoi.get(vocab.eos) if vocab.eos is not None else ids.get("\n", 0)
        return cls(ids, {i: c for c, i in ids.items()}, start,
                   "latin-1" if vocab.level == "byte" else "utf-8", " " if vocab.level == "ptb_char" else "")

    @property
    def gapless(self) -> bool:
        """Every byte is a token (a byte-level run): no file has a gap, and none is coded."""
        return self.encoding == "latin-1" and len(self.ids) == 256

    @cached_property
    def _byte_tables(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Where every byte is a token (a byte-level run's layout): ``[256]`` each byte's token and ``[max id + 1]``
        each token's byte (-1: none), computed once per layout (a file's blocks are joined one at a time); else
        ``None``."""
        if not self.gapless or any(chr(b) not in self.ids for b in range(256)):
            return None
        tokens = np.array([self.ids[chr(b)] for b in range(256)], dtype=np.int64)  # [256]
        spelled = np.full(max(self.chars) + 1, -1, dtype=np.int64)  # token -> its byte
        spelled[list(self.chars)] = [ord(c) for c in self.chars.values()]
        return tokens, spelled

    def text(self, data: bytes) -> str:
        return data.decode(self.encoding, errors="surrogateescape" if self.encoding == "utf-8" else "strict")

    def data(self, text: str) -> bytes:
        return text.encode(self.encoding, errors="surrogateescape" if self.encoding == "utf-8" else "strict")

    def gap_bytes(self, gap: str) -> bytes:
        """A gap as bytes (how a new gap is spelled out), always UTF-8 with escapes."""
        return gap.encode("utf-8", errors="surrogateescape")

    def gap_text(self, data: bytes) -> str:
        return data.decode("utf-8", errors="surrogateescape")

    def split(self, data: bytes) -> tuple[list[int], list[str]]:
        """``(tokens, gaps)`` of a file, ``len(gaps) == len(tokens) + 1`` (a gapless layout's by a table lookup of
        the bytes, the same as the loop below)."""
        if self._byte_tables is not None:
            return self._byte_tables[0][np.frombuffer(data, dtype=np.uint8)].tolist(), [""] * (len(data) + 1)
        tokens, gaps, gap = [], [], []
        ids = self.ids
        for c in self.text(data):
            i = ids.get(c)
            if i is None:
                gap.append(c)
            else:
                tokens.append(i)
                gaps.append("".join(gap))
                gap = []
        gaps.append("".join(gap))
        return tokens, gaps

    def join(self, tokens: list[int], gaps: list[str]) -> bytes:
        """The file that :meth:`split` read (``gaps`` has one more entry than ``tokens``)."""
        if self._byte_tables is not None and len(gaps) == len(tokens) + 1 and not any(gaps):
            spelled = self._byte_tables[1]  # [max id + 1]
            codes = np.asarray(tokens, dtype=np.int64)  # [N]
            if len(codes) and (codes.min() < 0 or codes.max() >= len(spelled) or (spelled[codes] < 0).any()):
                raise KeyError("a token that spells no byte")  # as the loop's lookup fails
            return spelled[codes].astype(np.uint8).tobytes()
        parts = [gaps[0]]
        for token, gap in zip(tokens, gaps[1:]):
            parts.append(self.chars[token])
            parts.append(gap)
        return self.data("".join(parts))

    def uncovered(self, data: bytes) -> Counter[str]:
        """The characters of a file that the vocabulary has no token for (a format's separator aside), with their
        counts: the model cannot predict them, and the gap table codes each at about a byte or more."""
        return Counter(c for c in self.text(data) if c not in self.ids and c != self.separator)


def coverage_warning(layout: Layout, data: bytes, name: str) -> str | None:
    """One line when the run's vocabulary misses characters of the file: how many, how often, the commonest."""
    missing = layout.uncovered(data)
    if not missing:
        return None
    count, total = sum(missing.values()), max(1, len(layout.text(data)))
    shown = ", ".join(f"byte 0x{ord(c) - 0xDC00:02x}" if 0xDC80 <= ord(c) <= 0xDCFF else repr(c)  # not UTF-8
                      for c, _ in missing.most_common(5))
    return (f"warning: the run's vocabulary has no token for {len(missing)} distinct character"
            f"{'s' * (len(missing) > 1)} of {name} ({count:,} of its {total:,} characters, "
            f"{100 * count / total:.2g}%; commonest {shown}): the model cannot predict them and they are coded "
            f"outside it at a byte or more each; a byte-level run covers every file")

