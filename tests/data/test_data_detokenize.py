"""Undoing WikiText's tokenization: lm-evaluation-harness's rules, article by article, from any cut of the text."""

from __future__ import annotations

from pathlib import Path

import pytest

from moglm.data.detokenize import articles, detokenize, wikitext

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
