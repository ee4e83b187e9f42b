"""Table 5.2 (Krause thesis 5.3): the change in log-probability at the target's step after one dynamic-evaluation
update on its segment, against a plain SGD step written out by hand, and through the command line."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from conftest import tiny_trained_run
from moglm.cli import main
from moglm.dynamic_evaluation import Hyperparameters
from moglm.dynamic_evaluation.evaluate import DynamicEvaluator
from moglm.dynamic_evaluation.related_words import related_words
from moglm.evaluation.stream_model import detach_state
from moglm.runs.language_model import LanguageModelRun


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return tiny_trained_run(tmp_path_factory.mktemp("related"), max_steps=8)


def test_the_change_is_one_sgd_step_on_the_segment_measured_at_the_targets_step(run):
    model, _, vocab = LanguageModelRun(run).load_model()
    model = model.double()
    ids = np.random.default_rng(0).integers(0, len(vocab), 23)
    hp = Hyperparameters(rule="sgd", lr=0.5, segment_length=5)
    result = related_words(DynamicEvaluator(model, hp), ids, 13, model.decoder_weight, vocab.itos, top=4)
    # by hand: segments of 5 targets; position 13 is target 12 of the stream, in the segment of targets 10..14
    reference = copy.deepcopy(model).eval()
    inputs, targets = torch.as_tensor(ids[:-1])[:, None], torch.as_tensor(ids[1:])[:, None]
    params = [p for p in reference.parameters() if p.requires_grad]
    state = None
    for start in range(0, 10, 5):  # the text before the target's segment, adapted as it is read
        nll, new_state = reference.nll(inputs[start : start + 5], targets[start : start + 5], state)
        grads = torch.autograd.grad(nll.mean(), params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p -= 0.5 * g
        state = detach_state(new_state)
    with torch.no_grad():
        before = reference.log_probs(inputs[10:15], state)[0][2, 0]
    nll, _ = reference.nll(inputs[10:15], targets[10:15], state)
    grads = torch.autograd.grad(nll.mean(), params)
    with torch.no_grad():
        for p, g in zip(params, grads):
            p -= 0.5 * g
        after = reference.log_probs(inputs[10:15], state)[0][2, 0]
    change = (after - before).double()
    target = int(ids[13])
    assert result["segment"] == [11, 15] and result["rows"][0]["word"] == vocab.itos[target]
    assert result["rows"][0]["cosine"] == pytest.approx(1.0)
    assert result["target_change"] == pytest.approx(float(change[target]), rel=1e-9, abs=1e-12)
    assert result["median"]["change"] == pytest.approx(float(change.median()), rel=1e-9, abs=1e-12)
    assert result["target_change"] > 0  # one step on a segment holding the word makes it more likely


def test_the_command_prints_the_table_and_writes_it_with_its_provenance(run, capsys):
    assert main(["related-words", str(run), "the", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "| the | 1.00 |" in out and "median over the vocabulary" in out
    saved = json.loads((run / "dyneval" / "related-the.json").read_text())
    assert saved["word"] == "the" and len(saved["rows"]) == 3 and saved["provenance"]["command"]
    assert main(["related-words", str(run), "zebra-not-a-word"]) == 1
    assert "is not in the run's vocabulary" in capsys.readouterr().err
