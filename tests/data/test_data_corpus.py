"""Corpora: formats, vocabularies from the training split, splitting, caching and clear errors."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from moglm.data import EOS, UNK, load_corpus
from moglm.data import corpus as corpus_module
from moglm.errors import MoglmError

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"


def _write(d: Path, **splits: str) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for name, text in splits.items():
        (d / f"{name}.txt").write_text(text)
    return d


def test_word_format_adds_eos_per_line_counts_blank_lines_and_maps_unknown_words_to_unk(tmp_path):
    d = _write(tmp_path / "c", train="a b\n\nb c\n", valid="a z\n", test="c\n")
    c = load_corpus(str(d), "word", use_cache=False)
    assert [c.vocab.itos[i] for i in c["train"]] == ["a", "b", EOS, EOS, "b", "c", EOS]
    assert [c.vocab.itos[i] for i in c["valid"]] == ["a", UNK, EOS]
    assert "z" not in c.vocab  # vocabulary from the training split only
    assert c.vocab.itos[0] == EOS  # most frequent first


def test_no_unk_is_added_when_every_token_is_known(tmp_path):
    d = _write(tmp_path / "c", train="a b\n", valid="a\n", test="b\n")
    assert UNK not in load_corpus(str(d), "word", use_cache=False).vocab


def test_ptb_char_format_ignores_the_final_lone_space_and_counts_words(tmp_path):
    d = _write(tmp_path / "c", train="a b _ c\n a\n ", valid="a _ b\n ", test="c\n ")
    c = load_corpus(str(d), "ptb_char", use_cache=False)
    assert [c.vocab.itos[i] for i in c["train"]] == ["a", "b", "_", "c", EOS, "a", EOS]
    assert c.words["train"] == 3  # ab, c | a
    assert c.vocab.decode(c["valid"]) == "a b\n"


def test_char_and_byte_formats(tmp_path):
    d = _write(tmp_path / "c", train="héllo wörld\n", valid="hé!\n", test="lo\n")
    c = load_corpus(str(d), "char", use_cache=False)
    assert len(c["train"]) == len("héllo wörld\n")
    assert c.vocab.decode(c["train"]) == "héllo wörld\n"
    assert c.vocab.itos[c["valid"][2]] == UNK
    assert c.words["train"] == 2
    b = load_corpus(str(d), "byte", use_cache=False)
    assert len(b.vocab) == 256 and len(b["train"]) == len("héllo wörld\n".encode())
    assert b.vocab.decode(b["train"]) == "héllo wörld\n"


def test_one_file_is_split_90_5_5_deterministically(tmp_path):
    f = tmp_path / "all.txt"
    f.write_text("".join(chr(ord("a") + i % 26) for i in range(1000)))
    c1 = load_corpus(str(f), "char", use_cache=False)
    c2 = load_corpus(str(f), "char", use_cache=False)
    assert [len(c1[s]) for s in ("train", "valid", "test")] == [900, 50, 50]
    for s in ("train", "valid", "test"):
        np.testing.assert_array_equal(c1[s], c2[s])
    assert c1.vocab.decode(c1["valid"]) == "".join(chr(ord("a") + i % 26) for i in range(900, 950))


def test_second_load_comes_from_the_cache_and_a_changed_file_invalidates_it(tmp_path, monkeypatch):
    d = _write(tmp_path / "c", train="a b\n", valid="a\n", test="b\n")
    first = load_corpus(str(d), "word")

    def fail(*a, **k):
        raise AssertionError("rebuilt instead of reading the cache")

    monkeypatch.setattr(corpus_module, "build_corpus", fail)
    cached = load_corpus(str(d), "word")
    np.testing.assert_array_equal(cached["train"], first["train"])
    assert cached.vocab.itos == first.vocab.itos
    monkeypatch.undo()
    (d / "train.txt").write_text("a b c\n")
    os.utime(d / "train.txt", ns=(1, 10**18))
    assert len(load_corpus(str(d), "word")["train"]) == 4


def test_default_corpus_is_the_python_documentation():
    c = load_corpus(None, "char")
    assert c.name == "pydoc" and len(c["train"]) > 100_000 and len(c.vocab) > 50


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda d: d, "found no files for the train split"),
        (lambda d: _write(d, train="", valid="a\n", test="a\n"), "train.txt: file is empty"),
        (lambda d: _write(d, train="\n\n", valid="a\n", test="a\n"), "file is empty"),
        (lambda d: _write(d, train="a\n", valid="a\n", test="a\n", train2="a\n"), "2 \\(train.txt, train2.txt\\)"),
    ],
)
def test_bad_corpora_give_one_line_errors_naming_the_file(tmp_path, setup, message):
    d = tmp_path / "bad"
    d.mkdir()
    setup(d)
    with pytest.raises(MoglmError, match=message) as e:
        load_corpus(str(d), "word", use_cache=False)
    assert "\n" not in str(e.value)


def test_missing_corpus_names_the_places_searched(tmp_path):
    with pytest.raises(MoglmError, match="not found.*MOGLM_DATA"):
        load_corpus(str(tmp_path / "nope"), "word")


def test_a_split_with_no_tokens_is_an_error(tmp_path):
    f = tmp_path / "short.txt"
    f.write_text("abcdefghij")  # 90/5/5 of 10 characters leaves valid with none
    with pytest.raises(MoglmError, match="valid split has no tokens"):
        load_corpus(str(f), "char", use_cache=False)


@pytest.mark.skipif(not (SHARED / "ptb").is_dir(), reason="benchmark corpora not found in ../shared/data")
@pytest.mark.parametrize(
    "name, fmt, sizes, vocab",
    [
        ("ptb", "word", (929_589, 73_760, 82_430), 10_000),
        ("ptb-char", "ptb_char", (5_017_482, 393_042, 442_423), 50),
        ("wikitext-2", "word", (2_088_628, 217_646, 245_569), 33_278),
    ],
)
def test_benchmark_corpora_match_their_published_statistics(name, fmt, sizes, vocab):
    c = load_corpus(str(SHARED / name), fmt)
    assert tuple(len(c[s]) for s in ("train", "valid", "test")) == sizes
    assert len(c.vocab) == vocab


def _enwik8_like(path: Path, size: int) -> None:
    """Wikipedia XML as UTF-8 bytes (markup, multi-byte characters), like enwik8's first bytes."""
    page = ('<page>\n  <title>Café in Zürich</title>\n  <text xml:space="preserve">[[Sprache|Deutsch]] '
            "naïve – ‘quoted’ &amp; 中文 {{cite}}</text>\n</page>\n").encode()
    path.write_bytes((page * (size // len(page) + 1))[:size])


def _text8_like(path: Path, size: int) -> None:
    """Lower-case words and single spaces, one line, no newline: text8's 27 symbols."""
    import random

    rng = random.Random(0)
    words = ["anarchism", "originated", "as", "a", "term", "of", "abuse", "first", "used", "against", "early",
             "working", "class", "radicals", "quiz", "jumps", "vex", "zebra", "by", "king"]
    text = " ".join(rng.choice(words) for _ in range(size))
    path.write_text(text[:size])


@pytest.mark.parametrize("config, make, fmt, vocab", [
    ("enwik8-mlstm-cpu", _enwik8_like, "byte", 256),
    ("enwik8-mlstm-paper", _enwik8_like, "byte", 256),
    ("text8-mlstm-cpu", _text8_like, "char", 27),
    ("text8-mlstm-paper", _text8_like, "char", 27),
])
def test_enwik8_and_text8_configs_read_one_file_at_the_standard_90_5_5_split(tmp_path, monkeypatch, config, make, fmt,
                                                                              vocab):
    """The shipped configs read $MOGLM_DATA/enwik8 (bytes) and $MOGLM_DATA/text8 (characters) as one file cut
    at 90% / 5% / 5%, which for the real 100,000,000-symbol files is the standard 90M / 5M / 5M split."""
    from moglm.runs.build import load_data
    from moglm.runs.config import load_config, shipped_configs

    name = config.split("-")[0]
    make(tmp_path / name, 20_000)
    monkeypatch.setenv("MOGLM_DATA", str(tmp_path))
    monkeypatch.chdir(tmp_path / "..")
    cfg = load_config(shipped_configs()[config])
    assert cfg.data.format == fmt and tuple(cfg.data.split_fractions) == (0.9, 0.05, 0.05)
    corpus = load_data(cfg.data)
    assert [len(corpus[s]) for s in ("train", "valid", "test")] == [18_000, 1_000, 1_000]
    assert len(corpus.vocab) == vocab
    if fmt == "byte":
        assert bytes(corpus["train"][:40].tolist()) == (tmp_path / name).read_bytes()[:40]
    else:
        assert set(corpus.vocab.itos) == set("abcdefghijklmnopqrstuvwxyz ")
        assert corpus.vocab.decode(corpus["test"]) == (tmp_path / name).read_text()[19_000:]
