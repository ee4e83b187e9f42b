"""``moglm related-words``: which words one dynamic-evaluation update makes more likely (thesis 5.3,
table 5.2)."""

from __future__ import annotations

from pathlib import Path

import typer

from .common import Checkpoint, Split


def related_words(
    run_dir: Path = typer.Argument(..., help="A word-level run made by `moglm train`."),
    word: str = typer.Argument(..., help="The word dynamic evaluation updates on (the thesis: production)."),
    split: Split = typer.Option("test", help="The split whose text is read up to the word."),
    occurrence: int = typer.Option(1, min=1, help="Which occurrence of the word in the split."),
    top: int = typer.Option(10, min=1, help="Words nearest to it by embedding cosine to list."),
    checkpoint: Checkpoint = typer.Option("best", help="The best or the last checkpoint."),
) -> None:
    """Which words one dynamic-evaluation update makes more likely (thesis 5.3, table 5.2): the words nearest
    to WORD by embedding, with the change of their log-probability at WORD's step, and the vocabulary's median."""
    from ..dynamic_evaluation.related_words import markdown_lines, related_words_of_run

    result = related_words_of_run(run_dir, word, getattr(split, "value", split), occurrence, top, checkpoint)
    typer.echo(f"{word!r}, occurrence {occurrence} of {getattr(split, 'value', split)} (position "
               f"{result['position']:,}), after one update on its segment:")
    typer.echo("\n".join(markdown_lines(result)))
