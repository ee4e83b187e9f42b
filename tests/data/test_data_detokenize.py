"""Undoing WikiText's tokenization: lm-evaluation-harness's rules, article by article, from any cut of the text."""

from __future__ import annotations

from pathlib import Path

import pytest

from moglm.data.detokenize import WRAP_WIDTHS, articles, detokenize, wikitext, wrap, wrap_lines

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"

PAGE = (' = Robert Boulter = \n \n Robert Boulter is an English film , television and theatre actor . He had a guest '
        '@-@ starring role in 2000 , 1 @,@ 500 people , 3 @.@ 5 % ( as " Craig " in " Teddy \'s Story " ) . \n'
        ' = = Career = = \n \n The = = = 2004 = = = Sat ; ok : fine ! ah ? 20 ° C \n')


def test_wikitext_rules_join_separators_punctuation_brackets_quotes_and_headings():
    text = wikitext(PAGE)
    assert "guest-starring" in text and "1,500 people" in text and "3.5 %" in text
    assert "film, television and theatre actor. He" in text
    assert '(as "Craig" in "Teddy\'s Story")' in text
    assert "== Career ==" in text and "=== 2004 ===" in text
    assert "Sat; ok: fine! ah? 20°C" in text
    assert " \n" not in text and "\n " not in text  # lines lose the spaces around them


def test_the_rules_are_lm_evaluation_harness_wikitext_detokenizer():
    preprocess = pytest.importorskip("lm_eval.tasks.wikitext.preprocess_wikitext")
    assert wikitext(PAGE) == preprocess.wikitext_detokenizer({"page": PAGE})


def test_articles_start_at_top_level_headings_whatever_the_pieces_were():
    text = " \n = A = \n \n a . \n = = Sub = = \n b \n = B = \n c , d \n"
    whole = list(articles([text]))
    assert whole == [" \n = A = \n \n a . \n = = Sub = = \n b \n", " = B = \n c , d \n"]
    lines = [line + "\n" for line in text.split("\n")[:-1]]
    assert list(articles(lines)) == whole  # one record per line (a datasets text file)
    assert list(articles([text[:7], text[7:30], text[30:]])) == whole  # cuts inside lines
    # article by article, as lm-eval detokenizes pages: an article's first space has no newline before it and stays
    assert "".join(detokenize("wikitext", [text])) == "\n= A =\n\na.\n== Sub ==\nb\n" + " = B =\nc, d\n"


def test_wrapping_turns_only_spaces_into_line_breaks_and_keeps_lines_within_the_width():
    line = "The manual explains how to use the editor, with examples of each command in turn. " * 4
    text = f"= Title =\n{line}\nShort line.\n{'x' * 90} and a word longer than the width\n"
    wrapped = wrap_lines(text, 40)
    assert len(wrapped) == len(text) and wrapped.replace("\n", " ") == text.replace("\n", " ")
    assert wrapped.count("\n") > text.count("\n") + 5
    long_lines = [x for x in wrapped.split("\n") if len(x) > 40]
    assert long_lines == ["x" * 90]  # a word longer than the width keeps a line of its own, unbroken
    assert "Short line.\n" in wrapped and wrapped.startswith("= Title =\n")  # short lines are left alone
    assert wrap_lines(text, 1000) == text


def test_every_other_article_is_wrapped_by_its_checksum_at_a_width_of_64_to_80():
    articles_ = [f"= Article {i} =\n" + f"word{i} " * 60 + "end\n" for i in range(40)]
    wrapped = [wrap(a) for a in articles_]
    assert wrapped == [wrap(a) for a in articles_]  # the same choice every time: the text decides
    changed = [w != a for w, a in zip(wrapped, articles_)]
    assert 10 < sum(changed) < 30
    for w, a, c in zip(wrapped, articles_, changed):
        widest = max(len(x) for x in w.split("\n"))
        assert len(w) == len(a) and (widest <= WRAP_WIDTHS[-1] if c else widest > WRAP_WIDTHS[-1])
        assert not c or widest > WRAP_WIDTHS[0] - len("word00 ")  # filled to a width of at least 64
    text = "".join(" = A%d = \n \n" % i + " word ," * 80 + " \n" for i in range(6))
    assert "".join(detokenize("wikitext-wrapped", [text])) == "".join(
        wrap(a) for a in detokenize("wikitext", [text]))


def test_an_unknown_detokenizer_is_refused():
    with pytest.raises(ValueError, match="unknown detokenizer 'ptb'"):
        list(detokenize("ptb", ["x"]))


@pytest.mark.skipif(not (SHARED / "wikitext-2").is_dir(), reason="WikiText-2 not found in ../shared/data")
def test_wikitext_2_test_split_detokenizes_like_lm_eval_page_by_page():
    preprocess = pytest.importorskip("lm_eval.tasks.wikitext.preprocess_wikitext")
    text = (SHARED / "wikitext-2" / "test.txt").read_text()
    pages = list(articles([text]))
    assert len(pages) == 62 and "".join(pages) == text  # 62 articles, nothing lost or added
    ours = "".join(detokenize("wikitext", [text]))
    assert ours == "".join(preprocess.wikitext_detokenizer({"page": p}) for p in pages)
    assert " @-@ " not in ours and " , " not in ours


@pytest.mark.skipif(not (SHARED / "wikitext-2").is_dir(), reason="WikiText-2 not found in ../shared/data")
def test_wikitext_2_wrapped_has_the_same_bytes_and_about_half_its_text_wrapped():
    text = (SHARED / "wikitext-2" / "test.txt").read_text()
    plain = list(detokenize("wikitext", [text]))
    wrapped = list(detokenize("wikitext-wrapped", [text]))
    assert len(plain) == len(wrapped) == 62
    assert "".join(wrapped).encode() != "".join(plain).encode()
    assert len("".join(wrapped).encode()) == len("".join(plain).encode())
    share = sum(len(w) for w, p in zip(wrapped, plain) if w != p) / sum(map(len, plain))
    assert 0.25 < share < 0.75
