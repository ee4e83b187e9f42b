"""A run answering lm-eval's requests (moglm.harness.scorer, no lm-eval needed): a rolling score is what
``moglm evaluate`` scores and, with dynamic evaluation, what ``moglm dyneval`` scores on the same text;
continuation scores are differences of rolling scores, each context read once; generation stops at a stop
string after one model step per token."""

from __future__ import annotations

import json

import pytest

from moglm.cli import main
from moglm.errors import MoglmError
from moglm.harness.loading import load_scorer
from moglm.harness.settings import HarnessSettings

from conftest import copied_run, dyneval_report, tiny_evaluated_document, tiny_evaluated_run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return tiny_evaluated_run(tmp_path_factory.mktemp("harness-scorer"))


def scorer_of(run, **model_args):
    scorer, resolved = load_scorer(HarnessSettings.from_args({"run": str(run), **model_args}), "cpu", lambda m: None)
    return scorer, resolved


def test_a_rolling_score_equals_moglm_evaluate_on_the_same_text(run):
    results = json.loads((run / "results.json").read_text())
    test = results["splits"]["test"]
    scorer, resolved = scorer_of(run)
    assert resolved["logit_factor"] == results["temperature"] != 1.0  # the factor moglm evaluate searched
    assert scorer.rolling(tiny_evaluated_document(run)) == pytest.approx(-test["xent"] * test["tokens"], rel=1e-12)


def test_a_dynamic_rolling_score_equals_moglm_dyneval_with_the_same_settings(run, tmp_path):
    document, run = tiny_evaluated_document(run), copied_run(run, tmp_path)
    assert main(["dyneval", str(run), "--rule", "sgd", "--learning-rate", "0.1", "-n", "7", "--no-progress"]) == 0
    split = dyneval_report(run, "full")["splits"]["test"]
    scorer, resolved = scorer_of(run, dynamic=True, rule="sgd", learning_rate=0.1, segment_length=7)
    result = scorer.rolling_dynamic(document)
    assert resolved["dynamic"]["from"] == "model_args"
    assert result.scores.nll == pytest.approx(split["dynamic"]["xent"] * split["dynamic"]["tokens"], rel=1e-12)
    assert result.static.nll == pytest.approx(split["static"]["xent"] * split["static"]["tokens"], rel=1e-12)
    assert result.scores.nll < result.static.nll


def test_dynamic_rolling_reads_the_settings_moglm_dyneval_saved(run, tmp_path):
    document, run = tiny_evaluated_document(run), copied_run(run, tmp_path)
    assert main(["dyneval", str(run), "--learning-rate", "0.002", "-n", "10", "--no-progress"]) == 0
    report = json.loads((run / "dyneval" / "full.json").read_text())  # rms-rmsdecay, with RMS statistics
    scorer, resolved = scorer_of(run, dynamic="true")
    assert resolved["dynamic"]["from"] == "dyneval/full.json"
    assert resolved["dynamic"]["hyperparameters"] == report["hyperparameters"]
    result = scorer.rolling_dynamic(document)
    split = report["splits"]["test"]["dynamic"]
    assert result.scores.nll == pytest.approx(split["xent"] * split["tokens"], rel=1e-12)


def test_a_continuation_score_is_a_difference_of_rolling_scores_and_each_context_is_read_once(run, monkeypatch):
    scorer, _ = scorer_of(run)
    context = "the cat sees the"
    choices = [" dog .", " cow .", " bird .\nthe owl"]
    reads = []
    read = scorer._read
    monkeypatch.setattr(scorer, "_read", lambda ids: reads.append(len(ids)) or read(ids))
    results = scorer.loglikelihood([(context, c) for c in choices] + [("", "the cat ."), (context, " fish .")])
    assert len(reads) == 2  # two distinct contexts
    for (score, _), choice in zip(results, choices + [None, " fish ."]):
        if choice is not None:
            assert score == pytest.approx(scorer.rolling(context + choice) - scorer.rolling(context), abs=1e-4)
    assert results[3][0] == pytest.approx(scorer.rolling("the cat ."), abs=1e-4)  # empty context: a rolling score


def test_is_greedy_says_whether_greedy_decoding_gives_the_continuation(run):
    scorer, _ = scorer_of(run)
    context = "the cat sees"
    greedy = scorer.generate(context, [], 4)
    words = greedy.split()
    other = next(w for w in ("dog", "cow", "owl", "fish") if w != words[0])
    (_, yes), (_, no) = scorer.loglikelihood([(context, greedy), (context, " " + " ".join([other, *words[1:]]))])
    assert yes and not no


def test_generation_stops_at_the_stop_string_after_one_step_per_token(run, monkeypatch):
    scorer, _ = scorer_of(run)
    full = scorer.generate("the cat sees", [], 12)
    assert "." in full
    steps = []
    log_probs = scorer.model.log_probs
    monkeypatch.setattr(scorer.model, "log_probs", lambda *a, **k: steps.append(a[0].shape) or log_probs(*a, **k))
    text = scorer.generate("the cat sees", ["."], 12)
    assert text == full.split(".")[0] and "." not in text
    assert steps == [(1, 1)] * len(scorer.tokens(text + "."))  # one token per step, stopping at the "."


def test_sampling_is_reproducible_with_a_seed(run):
    import torch

    scorer, _ = scorer_of(run)
    texts = [scorer.generate("the", [], 8, 1.0, 3, torch.Generator().manual_seed(5)) for _ in range(2)]
    assert texts[0] == texts[1]


def test_a_token_the_vocabulary_lacks_is_one_line_naming_it_when_there_is_no_unk(run):
    scorer, _ = scorer_of(run)
    assert scorer.vocab.unk is None
    with pytest.raises(MoglmError, match="'zebra' is not in the vocabulary, and the run's vocabulary has no <unk>"):
        scorer.rolling("the zebra sees the cat .")
