"""Corpora: files or a ``datasets`` corpus -> token ids for the train / valid / test splits, cached so a second
load takes seconds.

Formats:

* ``word``: whitespace tokens with ``<eos>`` after every line (blank lines included), as in Mikolov's
  PTB and the tokenized WikiText-2.
* ``ptb_char``: Mikolov's character-level PTB, symbols separated by spaces, ``_`` between words, and
  ``<eos>`` after every line.
* ``char``: plain text, one token per Unicode character (newlines included).
* ``byte``: any file as bytes (enwik8-style), a fixed vocabulary of 256.
* ``tokenizer``: subword tokens of a Hugging Face ``tokenizers`` tokenizer (:mod:`moglm.data.tokenizer`), given or
  trained on the training split; text it does not cover is an error, not ``<unk>``.

The vocabulary comes from the training split only; unknown tokens map to ``<unk>``. A directory is
searched for one ``*train*``, ``*valid*`` and ``*test*`` file each; a single file is split 90/5/5
by position. With no path at all, the Python documentation that ships with every interpreter
(``pydoc_data.topics``) is the corpus, at character level. A ``datasets`` corpus (``source``,
:mod:`moglm.data.sources`) streams record by record.

Every split also records the UTF-8 bytes of the text its tokens cover, the denominator of bits per byte, so
word, character, byte and subword models of one text compare: the text itself for ``char``, ``byte`` and
``tokenizer``; for ``word`` and ``ptb_char`` the text the tokens spell (:func:`spelled_bytes`: words joined by
single spaces, a newline per ``<eos>``). With ``detokenize`` (:mod:`moglm.data.detokenize`) the model reads the
text with the corpus's tokenization undone, and the bytes stay those of the original as its words spell it, as
lm-evaluation-harness's wikitext task counts the original page's bytes; so a word model of the tokenized
WikiText-2 and a subword or character model of the detokenized one share the denominator.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..atomic import atomic_directory
from ..errors import MoglmError
from .paths import resolve_path
from .vocabulary import EOS, UNK, Vocabulary

FORMATS = ("word", "ptb_char", "char", "byte", "tokenizer")
SPLITS = ("train", "valid", "test")
DEFAULT_CORPUS = "pydoc"


@dataclass(frozen=True)
class TextSize:
    """The words and UTF-8 bytes of the text a token stream covers: the denominators of bits per word and bits per
    byte (either ``None`` where unknown)."""

    words: int | None = None
    bytes: int | None = None

    def scored(self, predictions: int, tokens: int) -> "TextSize":
        """The share that ``predictions`` of a stream of ``tokens`` tokens span (a stream of n tokens makes n - 1
        predictions; striped batches drop a few more), counted in proportion."""
        share = predictions / max(tokens - 1, 1)
        return TextSize(*(None if n is None else int(round(n * share)) for n in (self.words, self.bytes)))


@dataclass
class Corpus:
    """Token ids of each split (``int64`` numpy arrays), their vocabulary, word counts for bits per word, and the
    bytes of the text each split covers for bits per byte."""

    name: str
    format: str
    vocab: Vocabulary
    splits: dict[str, np.ndarray]
    words: dict[str, int] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)

    def __getitem__(self, split: str) -> np.ndarray:
        if split not in self.splits:
            raise MoglmError(f"split must be one of {SPLITS}, got {split!r}")
        return self.splits[split]

    def text(self, split: str) -> TextSize:
        """The words and bytes of ``split``'s text (bits per word, bits per byte)."""
        return TextSize(self.words.get(split), self.bytes.get(split))

    def separator_id(self) -> int:
        """The token that ends a line or sequence: ``<eos>``, or the newline character (episodic batches
        and episodic evaluation start a new sequence after it)."""
        for token in (self.vocab.eos, "\n"):
            if token is not None and token in self.vocab.stoi:
                return self.vocab.stoi[token]
        raise MoglmError("episodic mode needs <eos> or newline tokens in the vocabulary")

    def digest(self) -> str:
        """A fingerprint of the token ids and the vocabulary: a run records it, so that evaluating after the
        corpus changed is refused instead of scoring other text."""
        h = hashlib.sha256(self.vocab.to_json().encode())
        for split in SPLITS:
            h.update(np.ascontiguousarray(self.splits[split], dtype=np.int64).tobytes())
        return h.hexdigest()[:16]

    def summary(self) -> str:
        sizes = ", ".join(f"{s} {len(self.splits[s]):,}" for s in SPLITS)
        return f"{self.name} ({self.format}): vocabulary {len(self.vocab):,}; tokens {sizes}"


# -- locating files ---------------------------------------------------------------------------------
def find_split_files(directory: Path) -> dict[str, Path]:
    """One ``*train*``, ``*valid*`` and ``*test*`` file in ``directory``."""
    found = {}
    files = sorted(p for p in directory.iterdir() if p.is_file() and not p.name.startswith("."))
    for split in SPLITS:
        matches = [p for p in files if split in p.name.lower() and p.suffix.lower() in (".txt", ".tokens", "")]
        if len(matches) != 1:
            what = "no" if not matches else f"{len(matches)} ({', '.join(m.name for m in matches)})"
            raise MoglmError(f"{directory}: found {what} files for the {split} split; name them in data.files")
        found[split] = matches[0]
    return found


# -- reading and tokenising --------------------------------------------------------------------------
def _read(path: Path, binary: bool) -> bytes | str:
    if not path.is_file():
        raise MoglmError(f"{path}: no such file")
    data = path.read_bytes()
    if not data.strip():
        raise MoglmError(f"{path}: file is empty")
    if binary:
        return data
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MoglmError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); use data.format = 'byte'") from None
    # a byte-order mark is not text, and Windows (CRLF) or old Mac (CR) line ends are line ends: neither
    # may become a token of a character model
    text = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    if not text.strip():
        raise MoglmError(f"{path}: file is empty")
    return text


def _line_tokens(text: str) -> list[str]:
    """Whitespace tokens of every line, each line followed by ``<eos>`` (word and ptb_char formats).

    A line is what ends with a newline (blank lines count, as in WikiText-2); a final fragment after
    the last newline counts only if it holds tokens (Mikolov's PTB char files end with a lone space).
    """
    tokens: list[str] = []
    for line in _lines(text):
        tokens.extend(line.split())
        tokens.append(EOS)
    return tokens


def _lines(text: str) -> list[str]:
    lines = text.split("\n")
    if not lines[-1].strip():
        lines.pop()
    return lines


def spelled_bytes(fmt: str, text: str) -> int:
    """UTF-8 bytes of the text that a word or PTB-char corpus's tokens spell: each line's words joined by single
    spaces (PTB char: its symbols joined, ``_`` a space), and a newline for its ``<eos>``. PTB's word and character
    files spell the same text, so their models divide by the same bytes."""
    total = 0
    for line in _lines(text):
        symbols = line.split()
        spelled = " ".join(symbols) if fmt == "word" else "".join(" " if x == "_" else x for x in symbols)
        total += len(spelled.encode("utf-8")) + 1
    return total


def _char_codes(text: str) -> np.ndarray:
    """Unicode code points of ``text`` as a uint32 array (fast for 100 MB texts)."""
    return np.frombuffer(text.encode("utf-32-le"), dtype="<u4")


_WHITESPACE = np.array([ord(c) for c in " \t\n\r\x0b\x0c"], dtype="<u4")


def _count_words(fmt: str, tokens) -> int:
    """Words in a split, the denominator of bits per word for character models."""
    if fmt == "word":
        return len(tokens)
    if fmt == "ptb_char":
        return sum(1 for t in tokens if t in ("_", EOS))
    space = np.isin(tokens, _WHITESPACE if fmt == "char" else _WHITESPACE.astype(np.uint8))
    starts = ~space & np.concatenate([[True], space[:-1]])  # a word starts after whitespace
    return int(starts.sum())


def _split_by_fraction(seq, fractions: tuple[float, float, float]):
    n = len(seq)
    a = int(n * fractions[0])
    b = a + int(n * fractions[1])
    return {"train": seq[:a], "valid": seq[a:b], "test": seq[b:]}


#: a split's text piece by piece (``str``, or ``bytes`` for a byte corpus read from files), afresh at every call:
#: a file is one piece, a ``datasets`` corpus one piece per record, so a corpus of any size streams
Pieces = Callable[[], Iterator["str | bytes"]]


def _pieces(raw) -> Pieces:
    return raw if callable(raw) else (lambda: iter([raw]))


def _counted(pieces: Iterable, measure: Callable[[object], int], total: list[int]) -> Iterator:
    """``pieces`` unchanged, adding ``measure`` of each to ``total[0]`` as they pass."""
    for piece in pieces:
        total[0] += measure(piece)
        yield piece


def _as_text(piece) -> str:
    return piece.decode("latin-1") if isinstance(piece, bytes) else piece


def build_corpus(name: str, fmt: str, raw_splits: dict[str, object], *, tokenizer=None,
                 train_tokenizer: tuple[str, int] | None = None, detokenize: str | None = None) -> Corpus:
    """Tokenise each split's text (a ``str``, ``bytes`` for ``byte``, or :data:`Pieces`) and index it with the
    vocabulary of the training split (``tokenizer``: a subword tokenizer's, or one trained on the training split
    with ``train_tokenizer = (kind, vocab size)``). ``detokenize`` names a :mod:`~moglm.data.detokenize` rule
    applied first; the bytes that bits per byte divide by are then those of the original text as words spell it."""
    originals = {s: _pieces(raw) for s, raw in raw_splits.items()}
    counts = {s: [0] for s in SPLITS}  # the UTF-8 bytes of each split's text, summed as the final pass reads it

    def text(split: str, count: bool = False) -> Iterator:
        pieces = originals[split]()
        if count:
            pieces = _counted(pieces, lambda p: text_bytes(fmt, p, detokenize), counts[split])
        return model_text(pieces, detokenize)

    if fmt == "tokenizer":
        if tokenizer is None:
            from .tokenizer import train_tokenizer as train

            tokenizer = train(text("train"), *train_tokenizer)
        vocab = Vocabulary.from_tokenizer(tokenizer)
    else:
        vocab = _train_vocabulary(name, fmt, {s: (lambda s=s: text(s)) for s in SPLITS})
    splits, words = {}, {}
    for s in SPLITS:
        if fmt == "tokenizer":
            splits[s], words[s] = _encode_with_tokenizer(vocab, text(s, True), s)
        else:
            splits[s], words[s] = _encode_split(vocab, fmt, text(s, True))
    for split, ids in splits.items():
        if len(ids) == 0 or (fmt in ("word", "ptb_char") and vocab.eos is not None
                             and bool((ids == vocab.stoi[vocab.eos]).all())):
            raise MoglmError(f"corpus {name}: the {split} split has no tokens")
        if len(ids) < 2:  # a prediction needs an input and a target
            raise MoglmError(f"corpus {name}: the {split} split has only {len(ids)} token; every split needs at least 2 "
                             "(a longer file, or other data.split_fractions)")
    return Corpus(name, fmt, vocab, splits, words, {s: counts[s][0] for s in SPLITS})


def model_text(pieces: Iterable, detokenize: str | None) -> Iterator:
    """The text a model reads: ``pieces`` as they are, or as text with the :mod:`~moglm.data.detokenize` rule
    ``detokenize`` applied."""
    if detokenize is None:
        return iter(pieces)
    from .detokenize import detokenize as undo

    return undo(detokenize, (_as_text(p) for p in pieces))


def text_bytes(fmt: str, piece, detokenize: str | None = None) -> int:
    """The bytes a piece of original text adds to bits per byte's denominator."""
    if detokenize is not None:
        return spelled_bytes("word", _as_text(piece))
    if isinstance(piece, bytes):
        return len(piece)
    if fmt in ("word", "ptb_char"):
        return spelled_bytes(fmt, piece)
    return len(piece.encode("utf-8"))


def _piece_tokens(fmt: str, piece):
    """One piece's tokens: a list of strings (word, ptb_char) or an array of codes (char) or bytes (byte)."""
    if fmt == "byte":
        return np.frombuffer(piece if isinstance(piece, bytes) else piece.encode("utf-8"), dtype=np.uint8)
    if fmt == "char":
        return _char_codes(piece)
    return _line_tokens(piece)


def _train_vocabulary(name: str, fmt: str, texts: dict[str, Pieces]) -> Vocabulary:
    """The vocabulary of the training split's tokens, with ``<unk>`` when valid or test hold others."""
    if fmt == "byte":
        return Vocabulary.bytes()
    counts: dict[str, Counter] = {s: Counter() for s in SPLITS}
    for s in SPLITS:
        for piece in texts[s]():
            tokens = _piece_tokens(fmt, piece)
            if fmt == "char":
                uniq, n = np.unique(tokens, return_counts=True)
                counts[s].update({chr(c): int(k) for c, k in zip(uniq, n)})
            else:
                counts[s].update(tokens)
    if fmt == "ptb_char":  # Mikolov's format: every symbol one character, words separated by "_"
        words = [x for s in SPLITS for x in counts[s] if len(x) > 1 and x not in (EOS, UNK)]
        if words:
            raise MoglmError(f"corpus {name}: not PTB char format: {len(words):,} tokens are longer than one character "
                             f"({', '.join(repr(w) for w in words[:3])}); plain text is data.format = \"char\"")
    need_unk = any(t not in counts["train"] for s in ("valid", "test") for t in counts[s])
    return Vocabulary.from_counts(counts["train"], fmt, need_unk, eos=EOS if fmt != "char" else None)


def _encode_split(vocab: Vocabulary, fmt: str, pieces: Iterable) -> tuple[np.ndarray, int]:
    """Ids and words of one split's pieces."""
    ids, words = [], 0
    for piece in pieces:
        tokens = _piece_tokens(fmt, piece)
        words += _count_words(fmt, tokens)
        if fmt == "byte":
            ids.append(tokens.astype(np.int64))
        elif fmt == "char":
            ids.append(_index_codes(vocab, tokens))
        else:
            ids.append(vocab.encode(tokens))
    return (np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)), words


def _index_codes(vocab: Vocabulary, codes: np.ndarray) -> np.ndarray:
    """Ids of code points (``char``), vectorised; unknown ones become ``<unk>``."""
    uniq, inverse = np.unique(codes, return_inverse=True)
    unk_id = vocab.stoi.get(vocab.unk, -1) if vocab.unk else -1
    lookup = np.array([vocab.stoi.get(chr(c), unk_id) for c in uniq], dtype=np.int64)
    return lookup[inverse.reshape(-1)] if len(codes) else np.zeros(0, dtype=np.int64)


#: the characters a tokenizer encodes at once: a split's text is cut after a newline that a non-space character
#: follows, where the common pre-tokenizers (byte-level, whitespace, metaspace) start a new token anyway
TOKENIZER_CHUNK = 1 << 16


def _chunks(text: str, size: int = TOKENIZER_CHUNK) -> Iterator[str]:
    start = 0
    while len(text) - start > size:
        cut = text.find("\n", start + size)
        while cut != -1 and cut + 1 < len(text) and text[cut + 1].isspace():
            cut = text.find("\n", cut + 1)
        if cut == -1 or cut + 1 >= len(text):
            break
        yield text[start:cut + 1]
        start = cut + 1
    yield text[start:]


def _encode_with_tokenizer(vocab: Vocabulary, pieces: Iterable[str], split: str) -> tuple[np.ndarray, int]:
    """Ids and whitespace-separated words of a split's text under ``vocab``'s tokenizer; a one-line error at the first piece of text it does not
    cover (it would become the unknown token), with its character offset in the split."""
    from .tokenizer import first_unknown, uncovered_message

    tokenizer, unk = vocab.tokenizer, vocab.unk
    unk_id = vocab.stoi[unk] if unk is not None else None
    ids, base, words = [], 0, 0
    for piece in pieces:
        chunks = list(_chunks(_as_text(piece)))
        for chunk, encoding in zip(chunks, tokenizer.encode_batch(chunks, add_special_tokens=False)):
            span = first_unknown(encoding.ids, encoding.offsets, unk_id)
            if span is not None:
                raise MoglmError(uncovered_message(f"{split} split", chunk, span, base, unk))
            ids.append(np.asarray(encoding.ids, dtype=np.int64))
            base += len(chunk)
            words += len(chunk.split())
    return (np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)), words


CACHE_VERSION = 3  # 2: byte-order marks dropped, CR and CRLF line ends read as newlines; 3: bytes per split


# -- caching --------------------------------------------------------------------------------------
def cache_root() -> Path:
    if os.environ.get("MOGLM_CACHE_DIR"):
        return Path(os.environ["MOGLM_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "moglm" / "corpora"


def _cache_key(parts: list) -> str:
    return hashlib.sha256(json.dumps([CACHE_VERSION, *parts], default=str).encode()).hexdigest()[:24]


def _load_cached(directory: Path) -> Corpus | None:
    """The cached corpus, or ``None`` for a miss: a missing, partial or damaged cache (a ``meta.json`` of
    ``{}``, a truncated array) is rebuilt, never an error."""
    try:
        meta = json.loads((directory / "meta.json").read_text())
        splits = {s: np.load(directory / f"{s}.npy", allow_pickle=False) for s in SPLITS}
        vocab = Vocabulary.from_json(json.dumps(meta["vocab"]))
        corpus = Corpus(meta["name"], meta["format"], vocab, splits, meta["words"], meta["bytes"])
        if any(len(a) < 2 or int(a.max()) >= len(vocab) for a in splits.values()):
            return None
        return corpus
    except Exception:  # any damage is a cache miss
        return None


def _store_cached(directory: Path, corpus: Corpus) -> None:
    """Best effort (an unwritable cache only costs speed); atomic, so readers see all or nothing."""
    try:
        with atomic_directory(directory) as tmp:
            for s in SPLITS:
                np.save(tmp / f"{s}.npy", corpus.splits[s].astype(np.int32 if len(corpus.vocab) > 65535 else np.uint16))
            meta = {"name": corpus.name, "format": corpus.format, "words": corpus.words, "bytes": corpus.bytes}
            meta["vocab"] = json.loads(corpus.vocab.to_json())
            (tmp / "meta.json").write_text(json.dumps(meta))
    except OSError:
        pass


# -- the entry point --------------------------------------------------------------------------------
@dataclass
class CorpusText:
    """Where a corpus's text comes from: its name, each split's text as :data:`Pieces` (read when called), and
    what keys its cached corpus."""

    name: str
    splits: dict[str, Pieces]
    key: list


def corpus_text(path: str | None = None, files: dict[str, str] | None = None,
                split_fractions: tuple[float, float, float] = (0.9, 0.05, 0.05), binary: bool = False, *,
                source: str | None = None, text_field: str = "text",
                split_names: dict[str, str] | None = None) -> CorpusText:
    """The text of a corpus (see :func:`load_corpus` for the arguments), split but not yet tokenised; ``binary``
    reads files as bytes."""
    if source is not None:
        from .sources import open_source

        opened = open_source(source, text_field, split_names, split_fractions)
        return CorpusText(opened.name, opened.splits, opened.key)
    if path is None or path == DEFAULT_CORPUS:
        from pydoc_data.topics import topics

        text = "".join(topics[k] for k in sorted(topics))
        raw = _split_by_fraction(text.encode("utf-8") if binary else text, split_fractions)
        return CorpusText(DEFAULT_CORPUS, {s: _pieces(raw[s]) for s in SPLITS},
                          [DEFAULT_CORPUS, sys.version_info[:3], len(text)])
    root = resolve_path(path)
    if files:
        unknown = set(files) - set(SPLITS)
        if unknown:
            raise MoglmError(f"data.files: unknown split {sorted(unknown)[0]!r} (expected {SPLITS})")
        base = root if root.is_dir() else root.parent
        split_files = {s: resolve_path(base / f) if not Path(f).is_absolute() else Path(f) for s, f in files.items()}
        if set(split_files) != set(SPLITS):
            raise MoglmError(f"data.files must name all of {SPLITS}")
    elif root.is_dir():
        split_files = find_split_files(root)
    else:
        split_files = {"all": root}
    stats = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in split_files.values() if p.exists()]
    if "all" in split_files:
        whole = functools.cache(lambda: _split_by_fraction(_read(split_files["all"], binary), split_fractions))
        splits = {s: (lambda s=s: iter([whole()[s]])) for s in SPLITS}
    else:
        splits = {s: (lambda f=split_files[s]: iter([_read(f, binary)])) for s in SPLITS}
    return CorpusText(root.name, splits, stats)


def load_corpus(
    path: str | None = None,
    format: str = "char",
    files: dict[str, str] | None = None,
    split_fractions: tuple[float, float, float] = (0.9, 0.05, 0.05),
    use_cache: bool = True,
    *,
    source: str | None = None,
    text_field: str = "text",
    split_names: dict[str, str] | None = None,
    tokenizer: str | None = None,
    train_tokenizer: tuple[str, int] | None = None,
    detokenize: str | None = None,
) -> Corpus:
    """Load a corpus. ``path``: a directory with train/valid/test files, one file (split by
    ``split_fractions``), or ``None`` for the default Python-documentation corpus (character level).
    ``files`` names the split files explicitly (relative to ``path`` when it is a directory). ``source``: a
    ``datasets`` corpus instead (:func:`moglm.data.sources.open_source`, its ``text_field`` and ``split_names``).
    ``format = "tokenizer"`` reads ``tokenizer`` (:func:`moglm.data.tokenizer.load_tokenizer`) or trains one on
    the training split (``train_tokenizer = (kind, vocab size)``); ``detokenize`` undoes the text's tokenization
    first (:mod:`moglm.data.detokenize`)."""
    if format not in FORMATS:
        raise MoglmError(f"data.format must be one of {FORMATS}, got {format!r}")
    options, tokenizer_key = _text_options(format, tokenizer, train_tokenizer, detokenize)
    extra = [] if tokenizer_key is None and detokenize is None else [tokenizer_key, detokenize]
    text = corpus_text(path, files, split_fractions, format == "byte" and detokenize is None, source=source,
                       text_field=text_field, split_names=split_names)
    key = _cache_key([text.key, format, split_fractions, CACHE_VERSION, *extra])
    return _with_cache(key, use_cache, lambda: build_corpus(text.name, format, text.splits, **options))


def _text_options(fmt: str, tokenizer: str | None, train_tokenizer: tuple[str, int] | None,
                  detokenize: str | None) -> tuple[dict, str | None]:
    """:func:`build_corpus`'s tokenizer and detokenizer options, checked, and what of them keys the cache (the
    tokenizer's own JSON, so an edited tokenizer file is a new corpus)."""
    from .detokenize import DETOKENIZERS

    if detokenize is not None and detokenize not in DETOKENIZERS:
        raise MoglmError(f"data.detokenize must be one of {DETOKENIZERS}, got {detokenize!r}")
    if detokenize is not None and fmt in ("word", "ptb_char"):
        raise MoglmError(f"data.detokenize applies to the char, byte and tokenizer formats: a {fmt} model reads the "
                         "corpus's own tokens")
    if fmt != "tokenizer":
        if tokenizer is not None or train_tokenizer is not None:
            raise MoglmError(f"data.tokenizer and data.tokenizer_training need data.format = \"tokenizer\" (not {fmt!r})")
        return {"detokenize": detokenize}, None
    if (tokenizer is None) == (train_tokenizer is None):
        raise MoglmError("data.format = \"tokenizer\" needs one of data.tokenizer (a tokenizer to read) and "
                         "data.tokenizer_training (one to train on the training split)")
    if tokenizer is None:
        return {"train_tokenizer": tuple(train_tokenizer), "detokenize": detokenize}, f"train:{list(train_tokenizer)}"
    from .tokenizer import load_tokenizer

    loaded = load_tokenizer(tokenizer)
    return {"tokenizer": loaded, "detokenize": detokenize}, hashlib.sha256(loaded.to_str().encode()).hexdigest()


def _with_cache(key: str, use_cache: bool, build) -> Corpus:
    directory = cache_root() / key
    if use_cache:
        cached = _load_cached(directory)
        if cached is not None:
            cached.splits = {s: a.astype(np.int64) for s, a in cached.splits.items()}
            return cached
    corpus = build()
    if use_cache:
        _store_cached(directory, corpus)
    return corpus
