"""A run's vocabulary as a transformers tokenizer: a ``PreTrainedTokenizerFast`` over a ``tokenizers``
word-level model that splits text as moglm splits a prompt (:func:`moglm.sampling.encode_prompt`):

* ``word``: whitespace tokens, a newline is ``<eos>``; decoded as words joined by spaces, ``<eos>`` as a newline;
* ``ptb_char``: one token per character, a space is ``_`` and a newline ``<eos>`` (Mikolov's character PTB);
* ``char``: one token per character (newlines included);
* ``byte``: one token per byte of the UTF-8 text, token id = byte value (``tokenizers``' byte-level alphabet
  spells the tokens; decoding gives the text back).

Token ids are the run's. The line separator (``<eos>``, or the newline character or byte) is the tokenizer's
``bos_token`` and ``eos_token`` and starts every encoded text, as every line of the training text followed one
(``tokenizer(text).input_ids`` equals ``TrainedRun.encode(text)``); decode with ``skip_special_tokens=False``
to keep the line breaks. The unknown token is ``unk_token`` where the vocabulary has one; a piece it does not
hold maps to it. Special tokens written in the text are read as text (``split_special_tokens``).
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from ..data.vocabulary import EOS, Vocabulary
from ..errors import MoglmError
from ..sampling import encode_prompt

#: one piece per character (a Unicode code point, newlines included)
ANY_CHARACTER = Regex(r"[\s\S]")


def _pieces(vocab: Vocabulary) -> tuple[dict[str, int], Tokenizer]:
    """The ``tokenizers`` vocabulary (piece -> the run's id) and a tokenizer that splits text as moglm does."""
    stoi = dict(vocab.stoi)
    level = vocab.level
    if level == "byte":
        piece = _bytes_to_unicode()
        stoi = {piece[ord(token)]: i for token, i in vocab.stoi.items()}  # the token of byte b is chr(b)
    tokenizer = Tokenizer(models.WordLevel(stoi, unk_token=vocab.unk))
    if level == "word":
        if vocab.eos is not None:
            tokenizer.normalizer = normalizers.Replace("\n", f" {vocab.eos} ")
        tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        # "▁" before every word, then the Metaspace decoder turns it into a space (none before the first)
        tokenizer.decoder = decoders.Sequence([decoders.Replace(Regex("^"), "▁"), decoders.Replace(f"▁{EOS}", "\n"),
                                               decoders.Metaspace(prepend_scheme="always")])
    elif level == "ptb_char":
        tokenizer.normalizer = normalizers.Sequence([normalizers.Replace(" ", "_"),
                                                     normalizers.Replace("\n", EOS)])
        tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(f"{EOS}|" + r"[\s\S]"), behavior="isolated")
        tokenizer.decoder = decoders.Sequence([decoders.Replace("_", " "), decoders.Replace(EOS, "\n"),
                                               decoders.Fuse()])
    elif level == "char":
        tokenizer.pre_tokenizer = pre_tokenizers.Split(ANY_CHARACTER, behavior="isolated")
        tokenizer.decoder = decoders.Fuse()
    elif level == "byte":
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            pre_tokenizers.Split(ANY_CHARACTER, behavior="isolated")])
        tokenizer.decoder = decoders.ByteLevel()
    else:
        raise MoglmError(f"a vocabulary of level {level!r} has no transformers tokenizer (word, ptb_char, char, byte)")
    return stoi, tokenizer


def _bytes_to_unicode() -> list[str]:
    """GPT-2's printable character for each byte value 0-255, the alphabet of ``tokenizers``' ByteLevel."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    out, extra = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def run_tokenizer(vocab: Vocabulary) -> PreTrainedTokenizerFast:
    """The transformers tokenizer of ``vocab`` (module docstring)."""
    stoi, tokenizer = _pieces(vocab)
    start_id = encode_prompt(vocab, "")[0] if (vocab.eos is not None or "\n" in vocab) else None
    special = {}
    if start_id is not None:
        start = next(piece for piece, i in stoi.items() if i == start_id)
        tokenizer.post_processor = processors.TemplateProcessing(
            single=[start, "$A"], pair=[start, "$A", start, "$B"], special_tokens=[(start, start_id)])
        special = {"bos_token": start, "eos_token": start}
    if vocab.unk is not None:
        special["unk_token"] = vocab.unk
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, clean_up_tokenization_spaces=False,
                                   split_special_tokens=True, model_input_names=["input_ids", "attention_mask"],
                                   **special)
