"""Subword corpora: tokenizers trained or read, their vocabulary in vocab.json, exact bytes, uncovered text refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from moglm.data import Vocabulary, load_corpus
from moglm.data import corpus as corpus_module
from moglm.data.tokenizer import load_tokenizer, train_tokenizer
from moglm.errors import MoglmError

pytest.importorskip("tokenizers")

TEXT = ("The cat sat on the mat.\nA dog sees a bird — naïve café!\n\n  indented line\tand a tab\n" * 30
        + "日本語 and emoji 🙂\n")


def _write(d, **splits):
    d.mkdir(parents=True, exist_ok=True)
    for name, text in splits.items():
        (d / f"{name}.txt").write_text(text, encoding="utf-8")
    return d


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_a_trained_byte_level_tokenizer_encodes_any_text_and_decodes_it_exactly(kind):
    tokenizer = train_tokenizer([TEXT], kind, 300)
    assert tokenizer.get_vocab_size() <= 300
    unseen = "Zebras ∑ unseen \x00 bytes\r\n"
    for text in (TEXT, unseen):
        assert tokenizer.decode(tokenizer.encode(text).ids) == text
    if kind == "bpe":  # deterministic (unigram training is not: a run keeps the tokenizer it trained)
        assert train_tokenizer([TEXT], kind, 300).to_str() == tokenizer.to_str()


def test_a_vocabulary_below_the_byte_alphabet_is_refused():
    with pytest.raises(MoglmError, match="below the 256 byte symbols"):
        train_tokenizer([TEXT], "bpe", 100)


def test_a_tokenizer_corpus_covers_its_text_exactly_and_counts_its_bytes(tmp_path):
    d = _write(tmp_path / "c", train=TEXT, valid="The cat sees a café.\n", test="日本 🙂 new words\n")
    c = load_corpus(str(d), "tokenizer", train_tokenizer=("bpe", 320), use_cache=False)
    assert c.format == "tokenizer" and len(c.vocab) <= 320
    for split, text in (("train", TEXT), ("valid", "The cat sees a café.\n"), ("test", "日本 🙂 new words\n")):
        assert c.vocab.decode(c[split]) == text
        assert c.bytes[split] == len(text.encode("utf-8"))
        assert c.words[split] == len(text.split())
    assert c.vocab.eos is not None and c.vocab.decode([c.vocab.stoi[c.vocab.eos]]) == "\n"  # the line separator
    assert c.separator_id() == c.vocab.stoi[c.vocab.eos]


def test_encoding_in_pieces_equals_encoding_the_whole_text(tmp_path, monkeypatch):
    """A split is encoded in chunks cut after a newline that a non-space follows; for a byte-level tokenizer
    that is the same as encoding it whole."""
    text = "".join(f"{' ' * (i % 3)}line {i} ends here . \n{'' if i % 4 else chr(10)}" for i in range(300))
    tokenizer = train_tokenizer([text], "bpe", 400)
    monkeypatch.setattr(corpus_module, "TOKENIZER_CHUNK", 50)
    chunks = list(corpus_module._chunks(text, 50))
    assert len(chunks) > 10 and "".join(chunks) == text
    vocab = Vocabulary.from_tokenizer(tokenizer)
    ids, _ = corpus_module._encode_with_tokenizer(vocab, [text], "train")
    np.testing.assert_array_equal(ids, tokenizer.encode(text).ids)


def test_the_tokenizer_travels_in_vocab_json(tmp_path):
    tokenizer = train_tokenizer([TEXT], "bpe", 300)
    vocab = Vocabulary.from_tokenizer(tokenizer)
    back = Vocabulary.from_json(vocab.to_json())
    assert back.level == "tokenizer" and back.itos == vocab.itos and back.eos == vocab.eos
    assert back.tokenizer.to_str() == tokenizer.to_str()
    assert back.decode(back.encode(back.tokenize_prompt("the cat\nsat"))) == "the cat\nsat"


def test_a_tokenizer_is_read_from_a_file_or_a_folder_and_keys_the_cache(tmp_path):
    tokenizer = train_tokenizer([TEXT], "bpe", 300)
    (tmp_path / "tok").mkdir()
    tokenizer.save(str(tmp_path / "tok" / "tokenizer.json"))
    assert load_tokenizer(str(tmp_path / "tok")).to_str() == tokenizer.to_str()
    assert load_tokenizer(str(tmp_path / "tok" / "tokenizer.json")).to_str() == tokenizer.to_str()
    d = _write(tmp_path / "c", train=TEXT, valid="The cat.\n", test="A dog.\n")
    first = load_corpus(str(d), "tokenizer", tokenizer=str(tmp_path / "tok"))
    other = train_tokenizer([TEXT], "bpe", 280)
    other.save(str(tmp_path / "tok" / "tokenizer.json"))
    assert len(load_corpus(str(d), "tokenizer", tokenizer=str(tmp_path / "tok")).vocab) != len(first.vocab)


def test_a_damaged_tokenizer_file_or_an_unknown_name_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(MoglmError, match="not a tokenizers JSON file") as e:
        load_tokenizer(str(bad))
    assert "\n" not in str(e.value)
    with pytest.raises(MoglmError, match="no such file or folder") as e:
        load_tokenizer("no-such-org/no-such-tokenizer")
    assert "\n" not in str(e.value)


def _word_level(tmp_path, words):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["[UNK]", *words])}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path = tmp_path / "words.json"
    tokenizer.save(str(path))
    return path


def test_a_tokenizer_that_does_not_cover_the_corpus_names_the_first_uncovered_piece_and_its_offset(tmp_path):
    path = _word_level(tmp_path, ["the", "cat", "sat"])
    d = _write(tmp_path / "c", train="the cat sat\nthe cat\n", valid="the cat\n", test="the cat zebra sat\n")
    with pytest.raises(MoglmError) as e:
        load_corpus(str(d), "tokenizer", tokenizer=str(path), use_cache=False)
    assert str(e.value) == ("the tokenizer cannot encode the test split: 'zebra' at character 8 becomes its unknown "
                            "token '[UNK]'")


def test_the_offset_counts_from_the_start_of_the_split_across_chunks(tmp_path, monkeypatch):
    path = _word_level(tmp_path, ["the", "cat", "sat"])
    monkeypatch.setattr(corpus_module, "TOKENIZER_CHUNK", 8)
    train = "the cat\n" * 5 + "the dog\n"
    d = _write(tmp_path / "c", train=train, valid="the\n", test="cat\n")
    with pytest.raises(MoglmError, match=r"train split: 'dog' at character 44 becomes"):
        load_corpus(str(d), "tokenizer", tokenizer=str(path), use_cache=False)


def test_bad_tokenizer_options_are_one_line_errors(tmp_path):
    d = _write(tmp_path / "c", train=TEXT, valid="a\n", test="b\n")
    with pytest.raises(MoglmError, match="needs one of data.tokenizer"):
        load_corpus(str(d), "tokenizer", use_cache=False)
    with pytest.raises(MoglmError, match="need data.format"):
        load_corpus(str(d), "char", tokenizer="x.json", use_cache=False)
    with pytest.raises(MoglmError, match="a word model reads the corpus's own tokens"):
        load_corpus(str(d), "word", detokenize="wikitext", use_cache=False)


def test_vocab_json_of_a_tokenizer_run_is_plain_json(tmp_path):
    vocab = Vocabulary.from_tokenizer(train_tokenizer([TEXT], "unigram", 300))
    data = json.loads(vocab.to_json())
    assert data["level"] == "tokenizer" and data["tokenizer"]["model"]["type"] == "Unigram"
