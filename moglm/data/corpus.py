"""Corpora: files -> token ids for the train / valid / test splits, cached so a second load takes seconds.

Formats:

* ``word``: whitespace tokens with ``<eos>`` after every line (blank lines included), as in Mikolov's
  PTB and the tokenized WikiText-2.
* ``ptb_char``: Mikolov's character-level PTB, symbols separated by spaces, ``_`` between words, and
  ``<eos>`` after every line.
* ``char``: plain text, one token per Unicode character (newlines included).
* ``byte``: any file as bytes (enwik8-style), a fixed vocabulary of 256.

The vocabulary comes from the training split only; unknown tokens map to ``<unk>``. A directory is
searched for one ``*train*``, ``*valid*`` and ``*test*`` file each; a single file is split 90/5/5
by position. With no path at all, the Python documentation that ships with every interpreter
(``pydoc_data.topics``) is the corpus, at character level.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..atomic import atomic_directory
from ..errors import MoglmError
from .vocabulary import EOS, UNK, Vocabulary

FORMATS = ("word", "ptb_char", "char", "byte")
SPLITS = ("train", "valid", "test")
CACHE_VERSION = 1
DEFAULT_CORPUS = "pydoc"


@dataclass
class Corpus:
    """Token ids of each split (``int64`` numpy arrays), their vocabulary, and word counts for bits per word."""

    name: str
    format: str
    vocab: Vocabulary
    splits: dict[str, np.ndarray]
    words: dict[str, int] = field(default_factory=dict)

    def __getitem__(self, split: str) -> np.ndarray:
        if split not in self.splits:
            raise MoglmError(f"split must be one of {SPLITS}, got {split!r}")
        return self.splits[split]

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
def data_search_path() -> list[Path]:
    """Where relative corpus paths are looked up: the working directory, ``$MOGLM_DATA``, and the
    ``shared/data`` folder beside the project checkout."""
    roots = [Path.cwd()]
    if os.environ.get("MOGLM_DATA"):
        roots.append(Path(os.environ["MOGLM_DATA"]))
    roots.append(Path(__file__).resolve().parents[3] / "shared" / "data")
    return roots


def resolve_path(path: str | os.PathLike) -> Path:
    """The first existing ``root / path`` over :func:`data_search_path` (absolute paths as they are)."""
    p = Path(path).expanduser()
    candidates = [p] if p.is_absolute() else [root / p for root in data_search_path()]
    for c in candidates:
        if c.exists():
            return c.resolve()
    where = ", ".join(str(c) for c in candidates)
    raise MoglmError(f"corpus {str(path)!r} not found (looked in: {where}; set MOGLM_DATA to its folder)")


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
    lines = text.split("\n")
    if not lines[-1].strip():
        lines.pop()
    tokens: list[str] = []
    for line in lines:
        tokens.extend(line.split())
        tokens.append(EOS)
    return tokens


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


def _index_codes(codes: dict[str, np.ndarray], fmt: str) -> tuple[Vocabulary, dict[str, np.ndarray]]:
    """Vocabulary and ids for code-point arrays (``char``), vectorised."""
    uniq, counts = np.unique(codes["train"], return_counts=True)
    need_unk = any(bool(np.isin(codes[s], uniq, invert=True).any()) for s in ("valid", "test"))
    vocab = Vocabulary.from_counts(Counter({chr(c): int(n) for c, n in zip(uniq, counts)}), fmt, need_unk)
    lookup = np.array([vocab.stoi[chr(c)] for c in uniq], dtype=np.int64)
    unk_id = vocab.stoi.get(vocab.unk, -1) if vocab.unk else -1
    ids = {}
    for s, c in codes.items():
        pos = np.clip(np.searchsorted(uniq, c), 0, len(uniq) - 1)
        ids[s] = np.where(uniq[pos] == c, lookup[pos], unk_id)
    return vocab, ids


def build_corpus(name: str, fmt: str, raw_splits: dict[str, object]) -> Corpus:
    """Tokenise raw split contents (str, or bytes for ``byte``) and index them with the train vocabulary."""
    if fmt == "byte":
        tokens = {s: np.frombuffer(raw, dtype=np.uint8) for s, raw in raw_splits.items()}
    elif fmt == "char":
        tokens = {s: _char_codes(raw) for s, raw in raw_splits.items()}
    else:
        tokens = {s: _line_tokens(raw) for s, raw in raw_splits.items()}
    if fmt == "ptb_char":  # Mikolov's format: every symbol one character, words separated by "_"
        words = [x for t in tokens.values() for x in dict.fromkeys(t) if len(x) > 1 and x not in (EOS, UNK)]
        if words:
            raise MoglmError(f"corpus {name}: not PTB char format: {len(words):,} tokens are longer than one character "
                             f"({', '.join(repr(w) for w in words[:3])}); plain text is data.format = \"char\"")
    for split, t in tokens.items():
        if len(t) == 0 or (fmt in ("word", "ptb_char") and all(x == EOS for x in t)):
            raise MoglmError(f"corpus {name}: the {split} split has no tokens")
        if len(t) < 2:  # a prediction needs an input and a target
            raise MoglmError(f"corpus {name}: the {split} split has only {len(t)} token; every split needs at least 2 "
                             "(a longer file, or other data.split_fractions)")
    if fmt == "byte":
        vocab, splits = Vocabulary.bytes(), {s: t.astype(np.int64) for s, t in tokens.items()}
    elif fmt == "char":
        vocab, splits = _index_codes(tokens, fmt)
    else:
        counts = Counter(tokens["train"])
        need_unk = any(t not in counts for s in ("valid", "test") for t in tokens[s])
        vocab = Vocabulary.from_counts(counts, fmt, need_unk, eos=EOS)
        splits = {s: vocab.encode(t) for s, t in tokens.items()}
    words = {s: _count_words(fmt, t) for s, t in tokens.items()}
    return Corpus(name, fmt, vocab, splits, words)


CACHE_VERSION = 2  # 2: byte-order marks dropped, CR and CRLF line ends read as newlines


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
        corpus = Corpus(meta["name"], meta["format"], vocab, splits, meta["words"])
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
            meta = {"name": corpus.name, "format": corpus.format, "words": corpus.words}
            meta["vocab"] = json.loads(corpus.vocab.to_json())
            (tmp / "meta.json").write_text(json.dumps(meta))
    except OSError:
        pass


# -- the entry point --------------------------------------------------------------------------------
def load_corpus(
    path: str | None = None,
    format: str = "char",
    files: dict[str, str] | None = None,
    split_fractions: tuple[float, float, float] = (0.9, 0.05, 0.05),
    use_cache: bool = True,
) -> Corpus:
    """Load a corpus. ``path``: a directory with train/valid/test files, one file (split by
    ``split_fractions``), or ``None`` for the default Python-documentation corpus (character level).
    ``files`` names the split files explicitly (relative to ``path`` when it is a directory)."""
    if format not in FORMATS:
        raise MoglmError(f"data.format must be one of {FORMATS}, got {format!r}")
    if path is None or path == DEFAULT_CORPUS:
        from pydoc_data.topics import topics

        text = "".join(topics[k] for k in sorted(topics))
        key = _cache_key([DEFAULT_CORPUS, sys.version_info[:3], len(text), format, split_fractions, CACHE_VERSION])
        raw = text.encode("utf-8") if format == "byte" else text
        return _with_cache(key, use_cache, lambda: build_corpus(DEFAULT_CORPUS, format, _split_by_fraction(raw, split_fractions)))
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
    key = _cache_key([stats, format, split_fractions, CACHE_VERSION])
    name = root.name

    def build() -> Corpus:
        binary = format == "byte"
        if "all" in split_files:
            raw = _split_by_fraction(_read(split_files["all"], binary), split_fractions)
        else:
            raw = {s: _read(split_files[s], binary) for s in SPLITS}
        return build_corpus(name, format, raw)

    return _with_cache(key, use_cache, build)


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
