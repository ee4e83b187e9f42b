"""Vocabularies: the mapping between tokens and ids, built from the training split only, or a subword
tokenizer's (:mod:`moglm.data.tokenizer`)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..errors import MoglmError

UNK = "<unk>"
EOS = "<eos>"


class Vocabulary:
    """Tokens (strings) <-> ids. ``level`` is the corpus format (``word``, ``ptb_char``, ``char``, ``byte`` or
    ``tokenizer``) and decides how prompts are split and decoded tokens joined; ``unk`` is the token unknown tokens
    map to (``None``: unknown tokens are an error). A ``tokenizer`` vocabulary holds its ``tokenizers.Tokenizer``
    (its JSON form travels in ``vocab.json``), which splits prompts and joins decoded tokens."""

    def __init__(self, tokens: Sequence[str], level: str, unk: str | None = None, eos: str | None = None,
                 tokenizer: dict[str, Any] | None = None) -> None:
        if (level == "tokenizer") != (tokenizer is not None):
            raise ValueError("a tokenizer vocabulary, and only one, holds its tokenizer")
        if len(set(tokens)) != len(tokens):
            raise ValueError("vocabulary tokens must be unique")
        if unk is not None and unk not in tokens:
            raise ValueError(f"unk token {unk!r} is not in the vocabulary")
        self.itos = list(tokens)
        self.stoi = {t: i for i, t in enumerate(self.itos)}
        self.level = level
        self.unk = unk
        self.eos = eos if eos in self.stoi else None
        self.tokenizer_json = tokenizer
        self._tokenizer = None

    @classmethod
    def from_tokenizer(cls, tokenizer) -> "Vocabulary":
        """The vocabulary of a ``tokenizers.Tokenizer``: its tokens in id order, its unknown token, and as the line
        separator the token a newline encodes to, when it is one token."""
        from .tokenizer import as_json, from_json, tokenizer_tokens, unknown_token

        # as the tokenizer reads back from its JSON (a unigram model's scores print rounded): a run's tokenizer
        # read from tokenizer.json gives the vocabulary, and the corpus fingerprint, it trained with
        tokenizer = from_json(tokenizer.to_str())
        tokens = tokenizer_tokens(tokenizer)
        newline = tokenizer.encode("\n", add_special_tokens=False).ids
        eos = tokens[newline[0]] if len(newline) == 1 else None
        vocab = cls(tokens, "tokenizer", unknown_token(tokenizer), eos, as_json(tokenizer))
        vocab._tokenizer = tokenizer
        return vocab

    @property
    def tokenizer(self):
        """The ``tokenizers.Tokenizer`` of a ``tokenizer`` vocabulary (``None`` for the others)."""
        if self._tokenizer is None and self.tokenizer_json is not None:
            from .tokenizer import from_json

            self._tokenizer = from_json(self.tokenizer_json)
        return self._tokenizer

    @classmethod
    def from_counts(cls, counts: Counter, level: str, need_unk: bool, eos: str | None = None) -> "Vocabulary":
        """Most frequent first (ties broken by the token itself, so the order is deterministic)."""
        tokens = [t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
        unk = UNK if (need_unk or UNK in counts) else None
        if unk is not None and unk not in counts:
            tokens.append(unk)
        return cls(tokens, level, unk, eos)

    @classmethod
    def bytes(cls) -> "Vocabulary":
        """All 256 byte values; byte b is the token ``chr(b)`` (latin-1)."""
        return cls([chr(b) for b in range(256)], "byte")

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, token: str) -> bool:
        return token in self.stoi

    def encode(self, tokens: Iterable[str]) -> np.ndarray:
        """Ids of ``tokens``; unknown ones become ``unk`` (a :class:`MoglmError` when there is none)."""
        stoi, unk_id = self.stoi, self.stoi.get(self.unk) if self.unk else None
        out = []
        for t in tokens:
            i = stoi.get(t, unk_id)
            if i is None:
                raise MoglmError(f"token {t!r} is not in the vocabulary (which has no {UNK})")
            out.append(i)
        return np.asarray(out, dtype=np.int64)

    def decode(self, ids: Iterable[int]) -> str:
        """Readable text: words joined by spaces with ``<eos>`` as a newline; characters joined directly."""
        if self.level == "tokenizer":
            return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)
        tokens = [self.itos[int(i)] for i in ids]
        if self.level == "word":
            return " ".join(tokens).replace(f" {EOS} ", "\n").replace(EOS, "\n")
        if self.level == "byte":
            return "".join(tokens).encode("latin-1").decode("utf-8", errors="replace")
        if self.level == "ptb_char":
            return "".join("\n" if t == EOS else " " if t == "_" else t for t in tokens)
        return "".join("\n" if t == EOS else t for t in tokens)

    def tokenize_prompt(self, text: str) -> list[str]:
        """Split user text into this vocabulary's tokens."""
        if self.level == "tokenizer":
            return self.tokenizer.encode(text, add_special_tokens=False).tokens
        if self.level == "word":
            return text.split()
        if self.level == "byte":
            return list(text.encode("utf-8").decode("latin-1"))
        if self.level == "ptb_char":
            return [("_" if c == " " else c) for c in text if c != "\n"]
        return list(text)

    def to_json(self) -> str:
        d = {"level": self.level, "unk": self.unk, "eos": self.eos, "tokens": self.itos}
        return json.dumps(d if self.tokenizer_json is None else d | {"tokenizer": self.tokenizer_json})

    @classmethod
    def from_json(cls, text: str) -> "Vocabulary":
        d = json.loads(text)
        return cls(d["tokens"], d["level"], d.get("unk"), d.get("eos"), d.get("tokenizer"))
