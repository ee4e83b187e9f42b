"""lm-evaluation-harness scoring a run through --model moglm, on local YAML tasks over local JSON lines (no
network): loglikelihood_rolling equals moglm evaluate, and with dynamic=true moglm dyneval, on the same text;
documents are independent (each from the trained weights); multiple-choice scores agree with rolling scores;
generate_until stops at the stop string; an unknown model_args key is refused; the entry point names the type."""

from __future__ import annotations

import json
import math
import re
import tomllib
from pathlib import Path

import pytest

lm_eval = pytest.importorskip("lm_eval")

from lm_eval.api.model import LM  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from moglm.cli import main  # noqa: E402
from moglm.errors import MoglmError  # noqa: E402
from moglm.harness.model import MoglmLM  # noqa: E402
from moglm.harness.tasks import (  # noqa: E402
    wikitext_articles, write_perplexity_task, write_task, write_wikitext_task)

from conftest import copied_run, dyneval_report, tiny_evaluated_document, tiny_evaluated_run  # noqa: E402

LINES = ["the cat sees the dog .\n", "the owl hears the fish .\nthe cow eats the bird .\n", "the dog likes the cat .\n"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The tiny run and a task manager over its local tasks: its test split as one document (tiny_ppl), three
    documents (tiny_lines), a multiple choice (tiny_choice) and a generation (tiny_generate)."""
    root = tmp_path_factory.mktemp("harness-lm-eval")
    run = tiny_evaluated_run(root)
    tasks, cache = root / "tasks", root / "datasets"
    write_perplexity_task(tasks, "tiny_ppl", [tiny_evaluated_document(run)], cache)
    write_perplexity_task(tasks, "tiny_lines", LINES, cache)
    write_task(tasks, "tiny_choice", [{"q": "the cat sees the", "choices": ["dog .", "cow .", "bird ."], "gold": 1},
                                      {"q": "the owl", "choices": ["hears the fish .", "eats ."], "gold": 0}], cache,
               output_type="multiple_choice", doc_to_text="{{q}}", doc_to_choice="{{choices}}",
               doc_to_target="{{gold}}", metric_list=[{"metric": "acc"}])
    write_task(tasks, "tiny_generate", [{"q": "the cat sees", "a": "the"}], cache, output_type="generate_until",
               doc_to_text="{{q}}", doc_to_target="{{a}}", generation_kwargs={"until": ["."], "max_gen_toks": 12},
               metric_list=[{"metric": "exact_match"}])
    return run, tasks, TaskManager(include_path=str(tasks), include_defaults=False)


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def evaluate(manager, run, tasks, model="moglm", **model_args):
    args = {"run": str(run), **model_args} if model == "moglm" else {}
    return lm_eval.simple_evaluate(model=model, model_args=args, tasks=tasks, task_manager=manager, log_samples=True,
                                   device="cpu")


def scores(out, task) -> list:
    """The model's answers to a task's requests, by document, in document order."""
    samples = sorted(out["samples"][task], key=lambda s: s["doc_id"])
    return [[r[0] for r in s["resps"]] for s in samples]


def test_rolling_loglikelihood_equals_moglm_evaluate_on_the_same_text(setup):
    run, _, manager = setup
    out = evaluate(manager, run, ["tiny_ppl"])
    test = json.loads((run / "results.json").read_text())["splits"]["test"]
    [[score]] = scores(out, "tiny_ppl")
    assert score == pytest.approx(-test["xent"] * test["tokens"], rel=1e-12)
    document = tiny_evaluated_document(run)
    words = len(re.split(r"\s+", document))  # lm-eval's count
    assert out["results"]["tiny_ppl"]["word_perplexity,none"] == pytest.approx(math.exp(-score / words))
    bits = -score / math.log(2) / len(document.encode())
    assert out["results"]["tiny_ppl"]["bits_per_byte,none"] == pytest.approx(bits)
    assert out["config"]["logit_factor"] == json.loads((run / "results.json").read_text())["temperature"]


def test_dynamic_true_equals_moglm_dyneval_and_every_document_starts_from_the_trained_weights(setup, tmp_path):
    run, _, manager = setup
    document, run = tiny_evaluated_document(run), copied_run(run, tmp_path)
    assert main(["dyneval", str(run), "--rule", "sgd", "--learning-rate", "0.1", "-n", "7", "--no-progress"]) == 0
    dynamic = dyneval_report(run, "full")["splits"]["test"]["dynamic"]
    settings = dict(dynamic=True, rule="sgd", learning_rate=0.1, segment_length=7)
    out = evaluate(manager, run, ["tiny_ppl", "tiny_lines"], **settings)
    [[score]] = scores(out, "tiny_ppl")
    assert score == pytest.approx(-dynamic["xent"] * dynamic["tokens"], rel=1e-12)
    alone = MoglmLM(run=str(run), device="cpu", **settings).scorer  # each document on its own, last first
    expected = [-alone.rolling_dynamic(text).scores.nll for text in reversed(LINES)][::-1]
    assert [s for [s] in scores(out, "tiny_lines")] == pytest.approx(expected, rel=1e-12)
    static = [alone.rolling(text) for text in LINES]
    assert sum(expected) != pytest.approx(sum(static))


def test_multiple_choice_scores_are_differences_of_rolling_scores(setup):
    run, _, manager = setup
    out = evaluate(manager, run, ["tiny_choice"])
    scorer = MoglmLM(run=str(run), device="cpu").scorer
    docs = [("the cat sees the", ["dog .", "cow .", "bird ."]), ("the owl", ["hears the fish .", "eats ."])]
    for (question, choices), answers in zip(docs, scores(out, "tiny_choice")):
        expected = [scorer.rolling(f"{question} {c}") - scorer.rolling(question) for c in choices]
        assert [a[0] for a in answers] == pytest.approx(expected, abs=1e-4)
    accuracy = [int(max(range(len(a)), key=lambda i: a[i][0]) == gold) for a, gold in
                zip(scores(out, "tiny_choice"), (1, 0))]
    assert out["results"]["tiny_choice"]["acc,none"] == pytest.approx(sum(accuracy) / 2)


def test_generate_until_stops_at_the_stop_string(setup):
    run, _, manager = setup
    out = evaluate(manager, run, ["tiny_generate"])
    [[text]] = scores(out, "tiny_generate")
    scorer = MoglmLM(run=str(run), device="cpu").scorer
    full = scorer.generate("the cat sees", [], 12)
    assert "." in full and text == full.split(".")[0]


def test_an_unknown_model_args_key_is_refused_naming_the_known_ones(setup):
    run, _, manager = setup
    with pytest.raises(MoglmError, match="unknown model_args key 'pretrained' .known: run, checkpoint, device"):
        evaluate(manager, run, ["tiny_ppl"], pretrained="gpt2")


@pytest.mark.parametrize("kwargs,message", [({"num_beams": 4}, "generation setting 'num_beams' is not supported"),
                                            ({"do_sample": True, "top_p": 0.9}, "top_p sampling is not supported")])
def test_a_generation_setting_moglm_cannot_honour_is_refused(kwargs, message):
    from moglm.harness.model import generation_options

    with pytest.raises(MoglmError, match=message):
        generation_options(kwargs)
    assert generation_options({"until": "\n\n", "do_sample": False, "temperature": 0.7}) == (["\n\n"], 256, 0.0, None)
    assert generation_options({"do_sample": True, "temperature": 0.7, "top_k": 5, "max_gen_toks": 9}) == ([], 9, 0.7, 5)


@pytest.mark.slow
def test_moglm_lm_eval_runs_lm_evals_command_line_with_one_line_errors(setup, capsys):
    run, tasks, _ = setup
    args = ["lm-eval", "--model", "moglm", "--tasks", "tiny_ppl", "--include_path", str(tasks), "--device", "cpu"]
    assert main([*args, "--model_args", f"run={run},colour=red"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("error: --model moglm: unknown model_args key 'colour' (known: run,")
    assert not any("Traceback" in line for line in err)
    assert main([*args, "--model_args", f"run={run}"]) == 0
    assert "word_perplexity" in capsys.readouterr().out


def test_the_entry_point_names_the_model_type():
    from importlib.metadata import EntryPoint

    from lm_eval.api.registry import Registry, get_model

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    target = pyproject["project"]["entry-points"]["lm_eval.models"]["moglm"]
    assert EntryPoint("moglm", target, "lm_eval.models").load() is MoglmLM
    registry = Registry("model")
    registry.register("moglm", target=target)  # lazily, as lm-eval registers its own types and plug-ins
    assert registry.get("moglm") is MoglmLM is get_model("moglm")


def test_the_local_wikitext_task_reads_articles_tokenized_or_as_lm_evals_wikitext_does(tmp_path):
    from lm_eval.tasks.wikitext.preprocess_wikitext import wikitext_detokenizer

    text = (" \n = Alpha = \n \n Alpha is a 1 @,@ 000 @-@ year test . \n \n = = History = = \n \n It ( was ) . \n"
            " = Beta = \n \n Beta 's line , here . \n")
    (tmp_path / "test.txt").write_text(text)
    articles = wikitext_articles(text)
    assert [a.splitlines()[0] for a in articles] == [" = Alpha = ", " = Beta = "] and "".join(articles) == text[2:]
    for detokenize in (False, True):
        path, count = write_wikitext_task(tmp_path / "test.txt", tmp_path / f"tasks-{detokenize}", "wt_local",
                                          detokenize, tmp_path / "datasets")
        manager = TaskManager(include_path=str(path.parent), include_defaults=False)
        out = lm_eval.simple_evaluate(model=Recorder(), tasks=["wt_local"], task_manager=manager, log_samples=True)
        samples = sorted(out["samples"]["wt_local"], key=lambda s: s["doc_id"])
        read = [s["arguments"][0][0] for s in samples]
        assert count == 2 and read == [wikitext_detokenizer({"page": a}) if detokenize else a for a in articles]
        words = sum(len(re.split(r"\s+", a)) for a in articles)  # counted on the tokenized articles either way
        assert out["results"]["wt_local"]["word_perplexity,none"] == pytest.approx(math.exp(2 / words))


class Recorder(LM):
    """An lm-eval model that scores every document -1 nat, to see what a task asks."""

    def loglikelihood(self, requests):
        raise NotImplementedError

    def loglikelihood_rolling(self, requests):
        return [-1.0 for _ in requests]

    def generate_until(self, requests):
        raise NotImplementedError
