"""Subword tokenizers (Hugging Face ``tokenizers``): training one, reading one, and a run's vocabulary from one.

:func:`train_tokenizer` trains byte-pair encoding (Sennrich et al. 2016, "Neural Machine Translation of Rare
Words with Subword Units") or a unigram language model (Kudo 2018, "Subword Regularization") over GPT-2's
byte-level pre-tokenization (Radford et al. 2019): every byte is in the alphabet, so any text encodes without
an unknown token and decodes to itself. :func:`load_tokenizer` reads a ``tokenizers`` JSON file, a folder with
one, or a pretrained tokenizer by name. Reading a tokenizer parses JSON; it never executes code.

``tokenizers`` (and, for a tokenizer by name, ``transformers``) are optional extras (``pip install
'moglm[data]'``), imported only when a tokenizer is used.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from ..errors import MoglmError
from .paths import find_local

KINDS = ("bpe", "unigram")
DEFAULT_KIND = "bpe"
DEFAULT_VOCAB_SIZE = 8000  # about WikiText-2's words per 4; lm-scale BPE vocabularies run to 32k-50k
TOKENIZER_FILE = "tokenizer.json"


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise MoglmError("subword tokenizers need the tokenizers package: pip install 'moglm[data]'") from None
    return tokenizers


def train_tokenizer(texts: Iterable[str], kind: str, vocab_size: int):
    """A byte-level ``kind`` (``bpe`` or ``unigram``) tokenizer of at most ``vocab_size`` tokens, trained on
    ``texts`` as they stream by."""
    tk = _tokenizers()
    if kind not in KINDS:
        raise MoglmError(f"tokenizer kind must be one of {KINDS}, got {kind!r}")
    alphabet = tk.pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + (kind == "bpe"):
        raise MoglmError(f"vocabulary size {vocab_size} is below the {len(alphabet)} byte symbols every byte-level "
                         "tokenizer holds; ask for more")
    if kind == "bpe":
        tokenizer = tk.Tokenizer(tk.models.BPE())
        trainer = tk.trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=alphabet, special_tokens=[],
                                         show_progress=False)
    else:
        tokenizer = tk.Tokenizer(tk.models.Unigram())
        trainer = tk.trainers.UnigramTrainer(vocab_size=vocab_size, initial_alphabet=alphabet, special_tokens=[],
                                             show_progress=False)
    tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tk.decoders.ByteLevel()
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def load_tokenizer(spec: str):
    """The ``tokenizers.Tokenizer`` of ``spec``: a ``tokenizers`` JSON file, a folder holding ``tokenizer.json``
    (a saved pretrained tokenizer), or a pretrained tokenizer's name (the local Hugging Face cache first, the
    Hub where there is network). One-line errors."""
    tk = _tokenizers()
    path = find_local(spec)
    if path is not None and path.is_dir() and (path / TOKENIZER_FILE).is_file():
        path = path / TOKENIZER_FILE
    if path is None or not path.is_file():
        return _pretrained(spec)
    try:
        return tk.Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - a damaged file fails in many ways, each one line
        raise MoglmError(f"{path}: not a tokenizers JSON file ({_first_line(e)})") from None


def _pretrained(name: str):
    """The fast tokenizer of a pretrained name, through ``transformers`` (which knows the Hub's layouts)."""
    try:
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging
    except ImportError:
        raise MoglmError(f"data.tokenizer {name!r}: no such file or folder; a pretrained tokenizer's name needs the "
                         "transformers package: pip install 'moglm[hf]'") from None
    hf_logging.set_verbosity_error()
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - no network, no such repository, a damaged cache: one line
        raise MoglmError(f"data.tokenizer {name!r}: no such file or folder, and no pretrained tokenizer of that "
                         f"name could be loaded ({_first_line(e)})") from None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise MoglmError(f"data.tokenizer {name!r}: a slow (Python) tokenizer; moglm reads fast (tokenizers) ones")
    return backend


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def tokenizer_tokens(tokenizer) -> list[str]:
    """The tokenizer's tokens in id order (ids must run from 0 without gaps, as a model's rows do)."""
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    tokens = [tokenizer.id_to_token(i) for i in range(size)]
    missing = [i for i, t in enumerate(tokens) if t is None]
    if missing:
        raise MoglmError(f"the tokenizer's ids have gaps (no token has id {missing[0]}); moglm needs ids 0..{size - 1}")
    return tokens


def unknown_token(tokenizer) -> str | None:
    """The token that the tokenizer's model writes for text it cannot encode, if it has one."""
    model = json.loads(tokenizer.to_str()).get("model", {})
    unk = model.get("unk_token")
    if isinstance(unk, str):
        return unk
    unk_id = model.get("unk_id")  # a unigram model names its unknown token by id
    return tokenizer.id_to_token(unk_id) if isinstance(unk_id, int) else None


def first_unknown(ids: list[int], offsets: list[tuple[int, int]], unk_id: int | None) -> tuple[int, int] | None:
    """The character span of the first token of ``ids`` that is ``unk_id``, or ``None``."""
    if unk_id is None:
        return None
    try:
        return offsets[ids.index(unk_id)]
    except ValueError:
        return None


def uncovered_message(what: str, text: str, span: tuple[int, int], base: int, unk: str) -> str:
    """The one line for text a tokenizer cannot encode: the first uncovered piece and its character offset
    (``span`` within ``text``, which starts at character ``base`` of the whole)."""
    start, end = span
    return (f"the tokenizer cannot encode the {what}: {text[start:end]!r} at character {base + start:,} becomes its "
            f"unknown token {unk!r}")


def as_json(tokenizer) -> dict[str, Any]:
    return json.loads(tokenizer.to_str())


def from_json(data: dict[str, Any] | str):
    return _tokenizers().Tokenizer.from_str(data if isinstance(data, str) else json.dumps(data))
