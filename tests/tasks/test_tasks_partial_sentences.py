"""Partial-sentence training (report 6.1): only the training sentences are cut; validation and test stay whole."""

from __future__ import annotations

import json

import pytest

from conftest import tiny_config
from moglm.errors import MoglmError
from moglm.tasks.partial_sentences import cut_text, run_partial_sentences, write_partial_corpus
from moglm.runs.config import DataConfig


@pytest.mark.parametrize(
    "fmt, text, cut, expected",
    [
        ("char", "the cat sat\nhi\n", 5, "the c\nhi\n"),
        ("word", "the cat sat on it\na b\n", 2, "the cat\na b\n"),
        ("ptb_char", " t h e _ c a t \n a \n", 4, "t h e _\na\n"),
        ("byte", b"abcdef\nxy\n", 3, b"abc\nxy\n"),
    ],
)
def test_each_line_keeps_its_first_tokens(fmt, text, cut, expected):
    assert cut_text(text, cut, fmt) == expected


def test_the_cut_is_applied_to_training_only(tiny_corpus, tmp_path):
    stats = write_partial_corpus(DataConfig(path=str(tiny_corpus), format="word"), 3, tmp_path / "data")
    train = (tmp_path / "data" / "train.txt").read_text().splitlines()
    assert all(len(line.split()) == 3 for line in train)  # 'the <noun> <verb> the <noun> .' -> 3 words
    for split in ("valid", "test"):
        assert (tmp_path / "data" / f"{split}.txt").read_text() == (tiny_corpus / f"{split}.txt").read_text()
    assert stats["train_lines_cut"] == 400 and stats["train_tokens_after"] == 1200


def test_a_single_file_corpus_is_split_first_then_cut(tmp_path):
    text = "".join(f"line number {i} has several words in it\n" for i in range(200))
    (tmp_path / "all.txt").write_text(text)
    write_partial_corpus(DataConfig(path=str(tmp_path / "all.txt"), format="char"), 10, tmp_path / "data")
    train = (tmp_path / "data" / "train.txt").read_text()
    assert max(len(line) for line in train.split("\n")) == 10
    start = int(len(text) * 0.9) + int(len(text) * 0.05)  # the 90/5/5 split of moglm.data.corpus
    assert (tmp_path / "data" / "test.txt").read_text() == text[start:]
    with pytest.raises(MoglmError, match="data.path"):
        write_partial_corpus(DataConfig(), 10, tmp_path / "none")


def test_training_on_cut_sentences_and_testing_on_whole_ones(tiny_corpus, tmp_path):
    cfg = tiny_config(tiny_corpus, train={"max_steps": 4, "eval_every": 2}, sample={"num_tokens": 0},
                      evaluation={"temperature_search": False})
    results = run_partial_sentences(cfg, 4, tmp_path / "run", progress=False, log=lambda s: None)
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["partial_sentences"]["statistics"]["cut"] == 4 and saved["splits"] == results["splits"]
    # evaluation ran on the whole sentences: as many tokens as the original test split (7 per line, 40 lines)
    assert results["splits"]["test"]["tokens"] == 40 * 7 - 1
    with pytest.raises(MoglmError, match="another corpus or cut"):
        run_partial_sentences(cfg, 5, tmp_path / "run", progress=False, log=lambda s: None)
