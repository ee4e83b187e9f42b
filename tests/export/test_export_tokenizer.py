"""The exported tokenizer of a run's vocabulary (word, ptb_char, char and byte): it encodes text to the ids moglm
gives a prompt (the line separator first, unknown pieces as ``<unk>``), keeps the run's tokens and ids, decodes
back to the text, and survives ``save_pretrained`` / ``AutoTokenizer.from_pretrained``."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")

from transformers import AutoTokenizer  # noqa: E402

from moglm.data.corpus import build_corpus  # noqa: E402
from moglm.data.vocabulary import EOS, UNK  # noqa: E402
from moglm.export.tokenizer import run_tokenizer  # noqa: E402
from moglm.sampling import encode_prompt  # noqa: E402

SPLITS = {
    "word": {"train": "the cat sees the dog .\nthe owl likes fish .\n", "valid": "the cow .\n", "test": "a dog .\n"},
    "ptb_char": {"train": "t h e _ c a t\nd o g _ .\n", "valid": "c o w\n", "test": "o w l\n"},
    "char": {"train": "héllo wörld, the cat.\nsecond line\n", "valid": "hé!\n", "test": "lo\n"},
    "byte": {"train": "héllo wörld\n", "valid": "hé!\n", "test": "lo\n"},
}
TEXTS = {
    "word": ["the cat sees the dog .", "the  cat\nthe zebra .\n", "dog", "", "\n\nthe"],
    "ptb_char": ["the cat", "cat dog\nthe.", "owl!", "", "a_b"],
    "char": ["héllo", "the cat.\nsecond\n", "snow ☃ and 😀", "", "   "],
    "byte": ["héllo wörld", "snow ☃ and 😀\n", "\x00\x7f", "", "Ċ is a letter"],
}


def vocabulary(level: str):
    raw = SPLITS[level]
    return build_corpus("tiny", level, {s: t.encode() if level == "byte" else t for s, t in raw.items()}).vocab


@pytest.mark.parametrize("level", list(SPLITS))
def test_text_encodes_to_the_ids_moglm_gives_a_prompt(level, tmp_path):
    vocab = vocabulary(level)
    run_tokenizer(vocab).save_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    for text in TEXTS[level]:
        assert tokenizer(text).input_ids == encode_prompt(vocab, text), text


@pytest.mark.parametrize("level", ["word", "ptb_char", "char"])
def test_the_tokens_are_the_runs_with_its_ids_and_special_tokens(level):
    vocab = vocabulary(level)
    tokenizer = run_tokenizer(vocab)
    assert len(tokenizer) == len(vocab)
    assert tokenizer.convert_ids_to_tokens(list(range(len(vocab)))) == vocab.itos
    separator = EOS if level in ("word", "ptb_char") else "\n"
    assert tokenizer.bos_token == tokenizer.eos_token == separator
    assert tokenizer.bos_token_id == vocab.stoi[separator] == encode_prompt(vocab, "")[0]
    assert tokenizer.unk_token == (UNK if vocab.unk else None)
    if vocab.unk:
        assert tokenizer.unk_token_id == vocab.stoi[UNK]


def test_a_byte_vocabulary_has_the_byte_values_as_ids_and_decodes_to_the_text():
    vocab = vocabulary("byte")
    tokenizer = run_tokenizer(vocab)
    assert len(tokenizer) == 256 and tokenizer.bos_token_id == ord("\n") and tokenizer.unk_token is None
    text = "héllo ☃ 😀\nline two"
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert ids == list(text.encode())
    assert tokenizer.decode(ids) == vocab.decode(ids) == text
    cut = list("☃".encode())[:2]  # a character cut in half decodes as moglm decodes it
    assert tokenizer.decode(cut) == vocab.decode(cut)


@pytest.mark.parametrize("level", ["ptb_char", "char"])
def test_characters_decode_as_moglm_decodes_them(level):
    vocab = vocabulary(level)
    tokenizer = run_tokenizer(vocab)
    for text in TEXTS[level]:
        ids = tokenizer(text, add_special_tokens=False).input_ids
        assert tokenizer.decode(ids) == vocab.decode(ids)


def test_words_decode_to_lines_that_encode_to_the_same_ids():
    vocab = vocabulary("word")
    tokenizer = run_tokenizer(vocab)
    ids = tokenizer("the cat sees\nthe dog .", add_special_tokens=False).input_ids
    assert tokenizer.decode(ids) == "the cat sees\n the dog ."
    assert tokenizer(tokenizer.decode(ids), add_special_tokens=False).input_ids == ids
    unknown = tokenizer("the zebra", add_special_tokens=False).input_ids
    assert unknown == [vocab.stoi["the"], vocab.stoi[UNK]] and tokenizer.decode(unknown) == "the <unk>"


def test_special_tokens_in_the_text_are_read_as_text():
    """A byte vocabulary's separator is spelled "Ċ" in tokenizers' byte alphabet: the letter Ċ in a text is still
    its two UTF-8 bytes, not a newline."""
    tokenizer = run_tokenizer(vocabulary("byte"))
    assert tokenizer("Ċ", add_special_tokens=False).input_ids == list("Ċ".encode())


def test_a_vocabulary_without_unknown_token_refuses_a_piece_it_lacks():
    vocab = vocabulary("char")
    vocab = type(vocab)([t for t in vocab.itos if t != UNK], "char")
    with pytest.raises(Exception, match="(?i)unk|missing"):
        run_tokenizer(vocab)("z")


def test_a_vocabulary_without_line_separator_starts_with_nothing():
    vocab = build_corpus("one-line", "char", {"train": "abcabc", "valid": "ab", "test": "ca"}).vocab
    tokenizer = run_tokenizer(vocab)
    assert tokenizer.bos_token is None and tokenizer("cab").input_ids == encode_prompt(vocab, "cab")

