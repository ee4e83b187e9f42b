"""``moglm tokenizer train``: a subword tokenizer for ``data.format = "tokenizer"`` (``data.tokenizer``)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .common import Detokenizer, TokenizerKind, new_app

app = new_app("Subword tokenizers: train one for data.format = \"tokenizer\".")


@app.command()
def train(
    corpus: str = typer.Argument(..., help="The corpus, as data.path names one: a directory with train/valid/test "
                                 "files, or one file (its first 90%); with --datasets, a datasets corpus as "
                                 "data.source names one. The tokenizer learns from the training split only."),
    vocab_size: Optional[int] = typer.Option(None, help="Tokens at most, the 256 byte symbols included "
                                             "(default: data.tokenizer_training's, 8000)."),
    kind: Optional[TokenizerKind] = typer.Option(None, help="bpe (byte-pair encoding) or unigram (default: bpe)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="The tokenizer JSON file to write "
                                          "(default: tokenizer-<kind>-<vocab size>.json)."),
    datasets: bool = typer.Option(False, "--datasets", help="CORPUS is a datasets corpus (data.source)."),
    text_field: str = typer.Option("text", help="--datasets: the field of each record that holds its text."),
    detokenize: Optional[Detokenizer] = typer.Option(None, help="Undo the corpus's tokenization first, as "
                                                     "data.detokenize does (wikitext)."),
    force: bool = typer.Option(False, "--force", "-f", help="Replace an existing --output file."),
) -> None:
    """Train a byte-level BPE or unigram tokenizer on a corpus's training split and save it as one JSON file
    (for data.tokenizer, and readable by the tokenizers library)."""
    from ..data.tokenizer_training import train_and_save

    path = train_and_save(corpus, output, kind=kind, vocab_size=vocab_size, datasets=datasets,
                          text_field=text_field, detokenize=detokenize, force=force)
    typer.echo(f"tokenizer: {path} (use it with data.format = \"tokenizer\", data.tokenizer = \"{path}\")")
