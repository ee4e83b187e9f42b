"""``moglm bench lm-eval``: lm-eval's wikitext perplexity of a run on a local WikiText-style test split, a static
and a dynamic row, each the sum of the articles' rolling scores."""

from __future__ import annotations

import json
import math
import random

import pytest

pytest.importorskip("lm_eval")

from conftest import tiny_config  # noqa: E402

from moglm.cli import main  # noqa: E402


def write_wikitext_like(directory, seed=0):
    """Train, valid and test files in the tokenized WikiText layout: `` = Title = `` articles of tiny sentences."""
    rng = random.Random(seed)
    nouns, verbs = ["cat", "dog", "owl", "cow"], ["sees", "likes"]
    directory.mkdir(parents=True)
    for split, articles in (("train", 40), ("valid", 4), ("test", 3)):
        lines = [" "]
        for _ in range(articles):
            lines += [f" = the {rng.choice(nouns)} = ", " "]
            lines += [" " + " ".join(f"the {rng.choice(nouns)} {rng.choice(verbs)} the {rng.choice(nouns)} ."
                                     for _ in range(3)) + " ", " "]
        (directory / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return directory


@pytest.mark.slow
def test_bench_lm_eval_scores_the_articles_static_and_dynamic(tmp_path, capsys, monkeypatch):
    from moglm.harness.loading import load_scorer
    from moglm.harness.settings import HarnessSettings
    from moglm.harness.tasks import wikitext_articles
    from moglm.train import Trainer

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    corpus = write_wikitext_like(tmp_path / "wiki")
    Trainer(tiny_config(corpus, sample={"num_tokens": 0}), tmp_path / "run", progress=False, log=lambda s: None).train()
    out = tmp_path / "report.json"
    assert main(["bench", "lm-eval", str(tmp_path / "run"), "--test-file", str(corpus / "test.txt"), "--task-dir",
                 str(tmp_path / "task"), "--dynamic-args", "rule=sgd,learning_rate=0.1,segment_length=5", "--out",
                 str(out)]) == 0
    assert "| static |" in capsys.readouterr().out
    report = json.loads(out.read_text())
    static, dynamic = report["rows"]
    assert report["task"]["articles"] == 3 and dynamic["resolved"]["dynamic"]["hyperparameters"]["rule"] == "sgd"
    scorer, _ = load_scorer(HarnessSettings.from_args({"run": str(tmp_path / "run")}), "cpu", lambda m: None)
    articles = wikitext_articles((corpus / "test.txt").read_text())
    total = sum(scorer.rolling(a) for a in articles)
    assert static["token_perplexity"] == pytest.approx(math.exp(-total / report["task"]["tokens"]))
    assert static["bits_per_byte"] == pytest.approx(-total / math.log(2) / report["task"]["bytes"])
    assert dynamic["bits_per_byte"] != pytest.approx(static["bits_per_byte"])
    assert main(["bench", "lm-eval", str(tmp_path / "run"), "--test-file", str(corpus / "test.txt"),
                 "--dynamic-args", "rule"]) == 1
    assert capsys.readouterr().err == "error: --dynamic-args: 'rule' is not key=value\n"
