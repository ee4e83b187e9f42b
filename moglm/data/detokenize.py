"""Undoing a corpus's tokenization, so that character, byte and subword models read the text it stands for.

``wikitext``: the tokenized WikiText release splits hyphens, number separators and punctuation off words
(``1 @,@ 500``, ``guest @-@ starring``, ``role .``). :func:`wikitext` undoes it with the rules of
lm-evaluation-harness's wikitext task (``lm_eval/tasks/wikitext/preprocess_wikitext.py``), applied as lm-eval
applies them: to one article at a time (Merity et al. 2016, "Pointer Sentinel Mixture Models", for the corpus).
An article starts at a top-level heading line, `` = Title = ``; :func:`articles` cuts a stream of text there,
so a corpus of any size is detokenized piece by piece.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

#: the detokenizers ``data.detokenize`` names
DETOKENIZERS = ("wikitext",)

_HEADING = re.compile(r"^ = [^=].* = $")  # `` = Title = ``; `` = = Section = = `` is not an article's start


def wikitext(page: str) -> str:
    """One article of the tokenized WikiText with lm-eval's ``wikitext_detokenizer`` rules, in its order."""
    string = page.replace("s '", "s'")  # contractions
    string = re.sub(r"/' [0-9]/", r"/'[0-9]/", string)
    for tokenized, text in ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."),  # number separators
                            (" : ", ": "), (" ; ", "; "), (" . ", ". "), (" ! ", "! "), (" ? ", "? "), (" , ", ", ")):
        string = string.replace(tokenized, text)
    string = re.sub(r"\(\s*([^\)]*?)\s*\)", r"(\1)", string)  # brackets and quotes hold their text tight
    string = re.sub(r"\[\s*([^\]]*?)\s*\]", r"[\1]", string)
    string = re.sub(r"{\s*([^}]*?)\s*}", r"{\1}", string)
    string = re.sub(r"\"\s*([^\"]*?)\s*\"", r'"\1"', string)
    string = re.sub(r"'\s*([^']*?)\s*'", r"'\1'", string)
    for tokenized, text in (("= = = =", "===="), ("= = =", "==="), ("= =", "=="), (" \u00b0 ", "\u00b0"),
                            (" \n", "\n"), ("\n ", "\n"), (" N ", " 1 "), (" 's", "'s")):
        string = string.replace(tokenized, text)
    return string


def articles(pieces: Iterable[str]) -> Iterator[str]:
    """The text of ``pieces`` (any cut: whole files, records, lines) regrouped into WikiText articles, each
    from its heading line to the line before the next heading; the text before the first heading is one more."""
    article: list[str] = []
    pending = ""  # a line not yet ended by a newline
    for piece in pieces:
        lines = (pending + piece).split("\n")
        pending = lines.pop()
        for line in lines:
            if _HEADING.match(line) and any(x.strip() for x in article):
                yield "".join(article)
                article = []
            article.append(line + "\n")
    if pending:
        article.append(pending)
    if article:
        yield "".join(article)


def detokenize(name: str, pieces: Iterable[str]) -> Iterator[str]:
    """``pieces`` of text with the tokenization ``name`` (one of :data:`DETOKENIZERS`) undone."""
    if name != "wikitext":
        raise ValueError(f"unknown detokenizer {name!r} (known: {', '.join(DETOKENIZERS)})")
    return (wikitext(article) for article in articles(pieces))
