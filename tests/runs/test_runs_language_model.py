"""``moglm.load_run``: a trained run from Python, with its vocabulary and tuned temperature."""

from __future__ import annotations

import pytest

import moglm
from conftest import tiny_config
from moglm.errors import MoglmError
from moglm.train import train_and_evaluate


@pytest.fixture
def trained(tiny_corpus, tmp_path):
    cfg = tiny_config(tiny_corpus, train={"max_steps": 8})
    _, results = train_and_evaluate(cfg, tmp_path / "run", progress=False, log=lambda s: None)
    return tmp_path / "run", results


def test_load_run_gives_the_model_vocabulary_and_the_searched_temperature(trained):
    path, results = trained
    run = moglm.load_run(path)
    assert run.temperature == results["temperature"] and not run.model.training
    assert len(run.vocab) == run.model.vocab_size and run.config.name == "tiny"


def test_score_of_a_split_matches_the_final_evaluation(trained, tiny_corpus):
    path, results = trained
    run = moglm.load_run(path)
    text = (tiny_corpus / "valid.txt").read_text()
    scores = run.score(text)  # the split as one stream from a zero state, at the tuned temperature
    assert scores.tokens == results["splits"]["valid"]["tokens"] + 1  # plus the leading line separator's target
    assert scores.xent == pytest.approx(results["splits"]["valid"]["xent"], rel=0.02)
    # bits per byte over the bytes the split's words spell, as the final evaluation counts them
    assert scores.bytes == results["splits"]["valid"]["bytes"] == len(text.encode())
    assert run.score("the cat sees").bytes == len("the cat sees")


def test_sample_continues_the_prompt_and_is_reproducible_with_a_seed(trained):
    run = moglm.load_run(trained[0])
    a = run.sample("the cat", num_tokens=6, seed=3)
    assert a.startswith("the cat") and a == run.sample("the cat", num_tokens=6, seed=3)
    assert len(a.split()) + a[len("the cat"):].count("\n") == 2 + 6  # <eos> reads as a line break


def test_a_folder_that_is_not_a_run_is_a_one_line_error(tmp_path):
    with pytest.raises(MoglmError, match="not a run directory"):
        moglm.load_run(tmp_path)
