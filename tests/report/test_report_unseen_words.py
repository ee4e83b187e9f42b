"""The unseen-word analysis (Krause thesis, section 5.3, table 5.1) on hand-made streams with known losses."""

from __future__ import annotations

import math

import numpy as np
import pytest

from moglm.data.corpus import build_corpus
from moglm.report.unseen_words import NO_UNSEEN_AT_WORD_LEVEL, analyse, figure, markdown_lines

# test text " hat the hat cat hat\n": position 0 is context only; then hat(1-3, space 4), the(5-7, 8),
# hat(9-11, 12), cat(13-15, 16), hat(17-19, newline 20). "hat" never occurs in training.
TEXTS = {
    "char": ("the cat sat on a mat\n", " hat the hat cat hat\n"),
    "byte": (b"the cat sat on a mat\n", b" hat the hat cat hat\n"),
    "ptb_char": ("t h e _ c a t _ s a t _ o n _ a _ m a t\n", "_ h a t _ t h e _ h a t _ c a t _ h a t\n"),
}
# each word's 3 letters and its separator: static 1 nat each (4 per word); dynamic per word below
DYNAMIC_WORDS = [4.4, 3.0, 2.0, 4.0, 1.0]  # hat (1st), the, hat (2nd), cat, hat (3rd)


def _losses() -> tuple[np.ndarray, np.ndarray]:
    static = np.ones(20)
    dynamic = np.concatenate([np.full(4, w / 4) for w in DYNAMIC_WORDS])  # targets at positions 1..20
    return static, dynamic


@pytest.mark.parametrize("fmt", sorted(TEXTS))
def test_an_unseen_word_that_repeats_gives_the_known_table(fmt):
    train, test = TEXTS[fmt]
    corpus = build_corpus("t", fmt, {"train": train, "valid": train, "test": test})
    static, dynamic = _losses()
    result = analyse(corpus["train"], corpus["test"], corpus.vocab, fmt, static, dynamic)
    assert result["level"] == "character" and result["words"] == 5 and result["tokens"] == 20
    unseen, seen, every = (result["groups"][k] for k in ("unseen", "seen", "all"))
    assert unseen["distinct"] == 1 and unseen["counts"] == [1, 1, 1, 0, 0]
    assert unseen["static"][:3] == [4.0, 4.0, 4.0] and unseen["static"][3:] == [None, None]
    assert unseen["dynamic"][:3] == pytest.approx([4.4, 2.0, 1.0])
    assert unseen["dynamic_better"] == {"first": 0.0, "all": pytest.approx(2 / 3)}
    assert unseen["gain"]["first"] == pytest.approx(-0.4) and unseen["gain"]["later"] == pytest.approx(2.5)
    # its loss falls faster, but dynamic never beats static at the 1st occurrence: not the thesis's finding
    assert unseen["checks"] == {"falls_faster": True, "beats_static_on_first": False} and unseen["reproduces"] is False
    assert unseen["bits_per_character"]["static"] == pytest.approx(1 / math.log(2))
    assert seen["distinct"] == 2 and seen["counts"] == [2, 0, 0, 0, 0]
    assert seen["dynamic"][0] == pytest.approx(3.5) and seen["dynamic_better"]["first"] == 0.5
    assert seen["reproduces"] is None  # no 2nd occurrence to compare
    # the thesis's own split: 1st occurrences (hat, the, cat) against re-occurrences (hat twice)
    assert every["counts"] == [3, 1, 1, 0, 0] and every["dynamic"][0] == pytest.approx((4.4 + 3 + 4) / 3)
    assert every["dynamic_better"]["first"] == pytest.approx(1 / 3) and every["reproduces"] is True
    assert result["repeated_unseen"] == [["hat", 3]]


def test_a_cut_first_word_and_an_unended_last_word_are_left_out():
    corpus = build_corpus("t", "char", {"train": "the cat\n", "valid": "the\n", "test": "at hat hat\n"})
    # 8 losses: targets "t hat ha" (positions 1..8); "at" touches position 0, the last "hat" ends past the prefix
    result = analyse(corpus["train"], corpus["test"], corpus.vocab, "char", np.ones(8), np.ones(8))
    assert result["words"] == 1 and result["groups"]["unseen"]["counts"] == [1, 0, 0, 0, 0]


def test_at_word_level_nothing_is_unseen_and_rare_words_stand_in():
    train = "the cat sat on the mat\nthe dog sat\nthe cat ran\nthe cat sat\n"
    corpus = build_corpus("w", "word", {"train": train, "valid": train, "test": "x dog zebra dog the dog\n"})
    # targets: dog, <unk>, dog, the, dog, <eos>
    static = np.array([2.0, 9.0, 2.0, 1.0, 2.0, 0.5])
    dynamic = np.array([2.5, 8.0, 1.0, 1.0, 0.5, 0.5])
    result = analyse(corpus["train"], corpus["test"], corpus.vocab, "word", static, dynamic)
    assert result["level"] == "word" and result["unk"] == 1 and result["note"] == NO_UNSEEN_AT_WORD_LEVEL
    assert set(result["groups"]) == {"rare", "frequent", "all"}
    rare, frequent = result["groups"]["rare"], result["groups"]["frequent"]  # dog: once in training; the: 4 times
    assert rare["counts"] == [1, 1, 1, 0, 0] and rare["dynamic"][:3] == [2.5, 1.0, 0.5]
    assert rare["gain"]["first"] == -0.5 and rare["gain"]["later"] == 1.25 and rare["reproduces"] is True
    assert "beats_static_on_first" not in rare["checks"]
    assert frequent["counts"] == [1, 0, 0, 0, 0] and result["words"] == 4  # <unk> and <eos> left out


def test_the_markdown_table_and_the_figure(tmp_path):
    from dataclasses import dataclass

    @dataclass
    class FakeRun:  # what the report reads of a run, with its corpus given
        label: str
        name: str = "run"

    import moglm.report.unseen_words as module

    corpus = build_corpus("t", "char", {"train": TEXTS["char"][0], "valid": "the\n", "test": TEXTS["char"][1]})
    static, dynamic = _losses()
    analysis = analyse(corpus["train"], corpus["test"], corpus.vocab, "char", static, dynamic)
    original = module.analyse_runs
    module.analyse_runs = lambda runs: {r.label: analysis for r in runs} | {"Broken": {"error": "x: gone"}}
    try:
        made = figure([FakeRun("LSTM")], tmp_path / "unseen_words-t.png", "T")
    finally:
        module.analyse_runs = original
    lines = markdown_lines(tmp_path / "unseen_words-t.json", "T")
    text = "\n".join(lines)
    assert ("| LSTM | unseen in training | 4.00 / 4.40 | 4.00 / 2.00 | 4.00 / 1.00 | - | - | 1 / 3 | 0.0% | 66.7% "
            "| no: dynamic never below static at a 1st occurrence |") in text
    assert "| LSTM | all words (thesis table 5.1's split) |" in text
    assert "Broken: no unseen-word analysis: x: gone." in text
    assert "`hat` (3)" in text
    if made is not None:  # matplotlib installed
        assert made.is_file() and made.stat().st_size > 0


def test_word_level_markdown_says_no_word_is_unseen(tmp_path):
    import json

    train = "the cat sat\nthe dog sat\n"
    corpus = build_corpus("w", "word", {"train": train, "valid": train, "test": "x dog zebra\n"})
    result = analyse(corpus["train"], corpus["test"], corpus.vocab, "word", np.ones(3), np.ones(3))
    (tmp_path / "u.json").write_text(json.dumps({"corpus": "W", "models": {"LSTM": result}}))
    text = "\n".join(markdown_lines(tmp_path / "u.json", "W"))
    assert NO_UNSEEN_AT_WORD_LEVEL in text and "| LSTM | rare in training (<= 2) |" in text


def test_a_corpus_that_spells_unk_out_has_no_unseen_words_and_says_why(tmp_path):
    """Mikolov's PTB char is the 10k-word PTB spelled out: its unknown words are the seen word ``<unk>``."""
    import json

    train = "t h e _ < u n k > _ c a t\n"
    corpus = build_corpus("c", "ptb_char", {"train": train, "valid": train, "test": "_ < u n k > _ t h e _ < u n k >\n"})
    n = len(corpus["test"]) - 1
    result = analyse(corpus["train"], corpus["test"], corpus.vocab, "ptb_char", np.ones(n), np.ones(n))
    assert result["groups"]["unseen"]["occurrences"] == 0 and result["spelled_unk"] == 2
    (tmp_path / "u.json").write_text(json.dumps({"corpus": "C", "models": {"LSTM": result}}))
    text = "\n".join(markdown_lines(tmp_path / "u.json", "C"))
    assert "No word of the scored test text is unseen in training: its unknown words are spelled out" in text
    assert "| LSTM | unseen in training | - | - | - | - | - | 0 / 0 | - | - | - (no words) |" in text


def test_table_5_1_scores_the_second_half_of_each_sequence_and_unseen_means_first_in_its_sequence():
    """Thesis 5.3, table 5.1: sequences of 2,000 tokens, the first 1,000 only conditioning; a word is unseen at its
    first occurrence in the sequence. Here sequences of 6 words, 2 of them conditioning, at word level."""
    from moglm.report.unseen_words import table_5_1

    #          sequence 1: a b | a c c b          sequence 2: c a | b b a d
    keys = ["a", "b", "a", "c", "c", "b", "c", "a", "b", "b", "a", "d"]
    static = [1.0] * 12
    dynamic = [2.0, 2.0, 0.5, 3.0, 0.5, 0.5, 2.0, 2.0, 0.5, 0.5, 0.5, 0.9]
    words = [(k, "frequent", s, d, 1, p + 1, p + 2) for p, (k, s, d) in enumerate(zip(keys, static, dynamic))]
    result = table_5_1(words, 12, sequence_length=6, conditioning=2)
    assert result["sequences"] == 2
    unseen, seen = result["groups"]["unseen"], result["groups"]["seen"]
    # unseen: c (seq 1, pos 4), b (seq 2, pos 9), d (seq 2): the first b of seq 2 is unseen although seq 1 had b
    assert unseen["count"] == 3 and unseen["dynamic"] == pytest.approx((3.0 + 0.5 + 0.9) / 3)
    assert unseen["dynamic_better"] == pytest.approx(2 / 3)
    assert seen["count"] == 5 and seen["dynamic"] == pytest.approx(0.5)  # a, c, b (seq 1); b, a (seq 2)


def test_table_5_1_is_in_the_analysis_and_in_its_markdown(tmp_path):
    train, test = TEXTS["char"]
    corpus = build_corpus("t", "char", {"train": train, "valid": train, "test": test})
    static, dynamic = _losses()
    result = analyse(corpus["train"], corpus["test"], corpus.vocab, "char", static, dynamic)
    split = result["table_5_1"]  # 20 tokens: one sequence, its first 10 tokens conditioning
    assert split["sequences"] == 1 and split["conditioning"] == 10
    assert split["groups"]["unseen"]["count"] == 1 and split["groups"]["seen"]["count"] == 1  # after 10 tokens: cat, hat
    import json

    path = tmp_path / "unseen_words-t.json"
    path.write_text(json.dumps({"corpus": "t", "models": {"m": result}}))
    text = "\n".join(markdown_lines(path, "t"))
    assert text.index("Table 5.1's split") < text.index("not table 5.1's definition")
