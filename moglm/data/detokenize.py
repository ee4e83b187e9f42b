"""Undoing a corpus's tokenization, so that character, byte and subword models read the text it stands for.

``wikitext``: the tokenized WikiText release splits hyphens, number separators and punctuation off words
(``1 @,@ 500``, ``guest @-@ starring``, ``role .``). :func:`wikitext` undoes it with the rules of
lm-evaluation-harness's wikitext task (``lm_eval/tasks/wikitext/preprocess_wikitext.py``), applied as lm-eval
applies them: to one article at a time (Merity et al. 2016, "Pointer Sentinel Mixture Models", for the corpus).
An article starts at a top-level heading line, `` = Title = ``; :func:`articles` cuts a stream of text there,
so a corpus of any size is detokenized piece by piece.

``wikitext-wrapped``: the same text as a plain-text file would hold it. WikiText keeps a paragraph on one line,
while README files, manuals, RFCs and books in plain text break their lines at 60-80 columns, and a model that
never saw a line break inside a sentence is sure it ends a paragraph. :func:`wrap` hard-wraps every other
article (chosen by a checksum of its text) at a width from 64 to 80 columns, also chosen by it, by turning the
space before a word that would pass the width into a line break: the bytes are the same in number, so bits per
byte keep their denominator.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Iterator

#: the detokenizers ``data.detokenize`` names
DETOKENIZERS = ("wikitext", "wikitext-wrapped")
#: the widths :func:`wrap` breaks lines at, one per wrapped article
WRAP_WIDTHS = range(64, 81)

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


def wrap_lines(text: str, width: int) -> str:
    """``text`` with each line longer than ``width`` broken greedily: the space before a word that would pass
    ``width`` columns becomes a line break (a word longer than the width keeps a line of its own). Only spaces
    change, so the result has as many characters and bytes as ``text``."""
    out = []
    for line in text.split("\n"):
        words = line.split(" ")
        pieces, length = [words[0]], len(words[0])
        for word in words[1:]:
            if length > 0 and length + 1 + len(word) > width:
                pieces += ["\n", word]
                length = len(word)
            else:
                pieces += [" ", word]
                length += 1 + len(word)
        out.append("".join(pieces))
    return "\n".join(out)


def wrap(article: str) -> str:
    """``article`` as a plain-text file might hold it: every other article (by the CRC-32 of its text) hard-wrapped
    by :func:`wrap_lines` at a width of :data:`WRAP_WIDTHS` that the same checksum picks, the others unchanged."""
    check = zlib.crc32(article.encode("utf-8"))
    if check % 2 == 0:
        return article
    return wrap_lines(article, WRAP_WIDTHS[(check >> 1) % len(WRAP_WIDTHS)])


def detokenize(name: str, pieces: Iterable[str]) -> Iterator[str]:
    """``pieces`` of text with the tokenization ``name`` (one of :data:`DETOKENIZERS`) undone."""
    if name not in DETOKENIZERS:
        raise ValueError(f"unknown detokenizer {name!r} (known: {', '.join(DETOKENIZERS)})")
    text = (wikitext(article) for article in articles(pieces))
    return text if name == "wikitext" else (wrap(article) for article in text)
