"""Bits per byte beside every native unit: word, character, byte and subword models of one text share the bytes."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from moglm.data import TextSize, load_corpus
from moglm.evaluation import Scores, evaluate_stream
from moglm.model import LanguageModel

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
TOKENIZED = " = Title = \n \n The cat , a 1 @,@ 000 @-@ year ( old ) cat . \n A dog 's bone . \n"


def _write(d: Path, text: str) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for split in ("train", "valid", "test"):
        (d / f"{split}.txt").write_text(text, encoding="utf-8")
    return d


def test_each_level_reports_its_own_unit_then_bits_per_byte():
    s = Scores(nll=20 * math.log(2), tokens=10, words=4, bytes=40)
    assert s.bits_per_byte == pytest.approx(0.5) and s.as_dict()["bits_per_byte"] == pytest.approx(0.5)
    assert s.headline("word") == "ppl 4.00 (xent 1.3863), 0.5000 bits/byte"
    assert s.headline("tokenizer") == "ppl 4.00 (xent 1.3863), 0.5000 bits/byte"
    assert s.headline("char") == "2.0000 bpc, 0.5000 bits/byte"  # bits per word stays in results.json
    # a byte model's own unit already is bits per byte, unless its text was rewritten (data.detokenize): then the
    # original text's bytes, the denominator every model of the corpus shares, are not the bytes it reads
    assert Scores(nll=20 * math.log(2), tokens=10, bytes=10).headline("byte") == "2.0000 bpb"
    assert s.headline("byte") == "2.0000 bpb, 0.5000 bits/byte"
    assert "bits/byte" not in Scores(nll=1.0, tokens=10).headline("word")


def test_a_stream_scores_the_bytes_its_predictions_span():
    torch.manual_seed(0)
    model = LanguageModel(9, 8, num_layers=1, architecture="lstm").double().eval()
    ids = np.random.default_rng(0).integers(0, 9, size=41)
    whole = evaluate_stream(model, ids, 1, 7, text=TextSize(words=10, bytes=200))
    assert whole.tokens == 40 and whole.bytes == 200 and whole.words == 10
    assert whole.bits_per_byte == pytest.approx(whole.nll / math.log(2) / 200)
    striped = evaluate_stream(model, ids, 3, 7, text=TextSize(words=10, bytes=200))  # 3 stripes of 13: 36 of 40
    assert striped.tokens == 36 and striped.bytes == 180 and striped.words == 9
    assert evaluate_stream(model, ids, 1, 7, max_tokens=20, text=TextSize(10, 200)).bytes is None  # a prefix: none


def test_word_char_byte_and_subword_corpora_of_one_text_share_their_bytes(tmp_path):
    text = "the cat sat\non the mat\n\nnaïve café\n"
    d = _write(tmp_path / "c", text)
    counts = {fmt: load_corpus(str(d), fmt, use_cache=False).bytes["test"] for fmt in ("word", "char", "byte")}
    pytest.importorskip("tokenizers")
    counts["tokenizer"] = load_corpus(str(d), "tokenizer", train_tokenizer=("bpe", 300), use_cache=False).bytes["test"]
    assert set(counts.values()) == {len(text.encode("utf-8"))}


def test_a_word_corpus_counts_the_text_its_tokens_spell(tmp_path):
    d = _write(tmp_path / "c", "  the   cat \n\n sat\n")  # words joined by one space, a newline per line
    assert load_corpus(str(d), "word", use_cache=False).bytes["test"] == len("the cat\n\nsat\n")


def test_a_detokenized_corpus_divides_by_the_bytes_of_the_original_words(tmp_path):
    d = _write(tmp_path / "c", TOKENIZED)
    word = load_corpus(str(d), "word", use_cache=False)
    char = load_corpus(str(d), "char", detokenize="wikitext", use_cache=False)
    assert char.vocab.decode(char["test"]).startswith(" = Title =\n\nThe cat, a 1,000-year (old) cat.\nA dog's")
    assert char.bytes == word.bytes  # a word model of the tokenized text and a character model of the detokenized


@pytest.mark.skipif(not (SHARED / "ptb-char").is_dir(), reason="PTB not found in ../shared/data")
def test_ptb_word_and_character_files_spell_the_same_bytes():
    word, char = load_corpus(str(SHARED / "ptb"), "word"), load_corpus(str(SHARED / "ptb-char"), "ptb_char")
    assert word.bytes == char.bytes == {"train": 5_017_482, "valid": 393_042, "test": 442_423}


@pytest.mark.skipif(not (SHARED / "wikitext-2").is_dir(), reason="WikiText-2 not found in ../shared/data")
def test_wikitext_2_words_and_its_detokenized_characters_share_the_bytes():
    word = load_corpus(str(SHARED / "wikitext-2"), "word")
    char = load_corpus(str(SHARED / "wikitext-2"), "char", detokenize="wikitext")
    assert word.bytes == char.bytes == {"train": 10_736_663, "valid": 1_115_460, "test": 1_249_200}
    assert len(char["test"]) < word.bytes["test"]  # the detokenized text is shorter than the words spell
