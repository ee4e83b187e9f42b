"""``moglm tokenizer train``: a subword tokenizer trained on a corpus's training split, as a run would read it,
saved as one ``tokenizers`` JSON file for ``data.tokenizer``."""

from __future__ import annotations

from pathlib import Path

from ..atomic import atomic_write_text, check_free
from .corpus import corpus_text, model_text
from .tokenizer import DEFAULT_KIND, DEFAULT_VOCAB_SIZE, train_tokenizer


def train_and_save(corpus: str, output: str | Path | None = None, *, kind: str | None = None,
                   vocab_size: int | None = None, datasets: bool = False, text_field: str = "text",
                   detokenize: str | None = None, force: bool = False) -> Path:
    """Train a ``kind`` tokenizer of ``vocab_size`` tokens on the training split of ``corpus`` (``data.path``, or
    with ``datasets`` a ``data.source`` and its ``text_field``), with ``detokenize`` applied as ``data.detokenize``
    applies it, and write it to ``output`` (default ``tokenizer-<kind>-<vocab size>.json``); refuses to replace a
    file without ``force``. Returns the path written."""
    kind, vocab_size = kind or DEFAULT_KIND, vocab_size or DEFAULT_VOCAB_SIZE
    path = Path(output or f"tokenizer-{kind}-{vocab_size}.json")
    check_free(path, force)
    if datasets:
        text = corpus_text(source=corpus, text_field=text_field)
    else:
        text = corpus_text(corpus)
    tokenizer = train_tokenizer(model_text(text.splits["train"](), detokenize), kind, vocab_size)
    check_free(path, force)
    atomic_write_text(path, tokenizer.to_str(pretty=True))
    return path
