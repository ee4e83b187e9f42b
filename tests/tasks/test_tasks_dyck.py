"""Bounded Dyck-k: the generator's sequences are balanced, bounded, of every type and reproducible; WCPA on
hand-made predictions; a hand-set Dyck-RNN scores 100% through the evaluation code; training resumes."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from moglm.errors import MoglmError
from moglm.tasks.dyck import DyckLanguage, DyckTask, bracket_tokens, prepare_corpus, read_sequences
from moglm.tasks.dyck_training import ClosingBracketModel, DyckTraining, lm_wcpa, run_dyck
from moglm.tasks.wcpa import closing_predictions, evaluate_wcpa, wcpa_from_probabilities
from moglm.runs import CheckpointStore, RunDirectory
from moglm.runs.language_model import LanguageModelRun


def _depths(sequence, k):
    stack, depths = [], []
    for b in sequence:
        if b < k:
            stack.append(b)
        else:
            assert stack and stack.pop() == b - k, "closes a bracket that is not on top"
        depths.append(len(stack))
    return stack, depths


@pytest.mark.parametrize("k, m", [(2, 4), (3, 2), (5, 8)])
def test_sequences_are_balanced_bounded_use_every_type_and_respect_lengths(k, m):
    sequences = DyckLanguage(k, m).sample_many(300, (10, 60), seed=7)
    for s in sequences:
        stack, depths = _depths(s, k)
        assert not stack and max(depths) <= m and 10 <= len(s) <= 60
    assert {b for s in sequences for b in s} == set(range(2 * k))  # every open and close type occurs
    assert max(max(_depths(s, k)[1]) for s in sequences) == m  # the bound is reached


def test_the_same_seed_gives_the_same_sequences_and_splits_differ():
    language = DyckLanguage(2, 4)
    assert language.sample_many(50, (2, 40), seed=3) == language.sample_many(50, (2, 40), seed=3)
    assert language.sample_many(50, (2, 40), seed=3) != language.sample_many(50, (2, 40), seed=4)
    splits = DyckTask(train_sequences=30, valid_sequences=30, test_sequences=30).splits()
    assert splits == DyckTask(train_sequences=30, valid_sequences=30, test_sequences=30).splits()
    assert splits["train"] != splits["valid"]
    assert min(len(s) for s in splits["test"]) >= 102 > max(len(s) for s in splits["train"])


def test_open_probability_controls_depth_and_bad_settings_are_errors():
    def mean_depth(p):
        sequences = DyckLanguage(2, 8, open_probability=p).sample_many(200, (40, 80), seed=1)
        return np.mean([np.mean(_depths(s, 2)[1]) for s in sequences])

    assert mean_depth(0.7) > mean_depth(0.3) + 1
    with pytest.raises(MoglmError, match="open_probability"):
        DyckLanguage(2, 4, open_probability=1.0)
    with pytest.raises(MoglmError, match="no sequence"):
        DyckLanguage(2, 4).sample(random.Random(0), 10, 5)


def test_corpus_files_round_trip_with_the_bracket_embedding_token_order(tmp_path):
    assert bracket_tokens(2) == ["(", "[", ")", "]"]
    assert bracket_tokens(5)[4] == "(4" and bracket_tokens(5)[9] == "4)"
    task = DyckTask(train_sequences=20, valid_sequences=5, test_sequences=5)
    prepare_corpus(task, tmp_path)
    assert read_sequences(tmp_path / "train.txt", 2) == task.splits()["train"]
    assert (tmp_path / "valid.txt").read_text().splitlines()[0].split()[0] in ("(", "[")


def test_closing_predictions_and_distances():
    # ( [ ] ( ) )  ->  ids 0 1 3 0 2 2
    sequence = [0, 1, 3, 0, 2, 2]
    assert closing_predictions(sequence, 2) == [(2, 1, 1), (4, 0, 1), (5, 0, 5)]
    # open_stack: every position read with a non-empty stack, distance to the top's opening bracket
    assert closing_predictions(sequence, 2, "open_stack") == [(1, 0, 1), (2, 1, 1), (3, 0, 3), (4, 0, 1), (5, 0, 5)]
    with pytest.raises(ValueError, match="well-nested"):
        closing_predictions([0, 3], 2)


def test_wcpa_perfect_threshold_and_worst_case_over_buckets():
    distances = np.array([1, 1, 3, 3, 5, 6, 7, 9, 12, 20] * 3)
    perfect = wcpa_from_probabilities(np.ones(30), distances, min_count=1)
    assert perfect.wcpa == 1.0 and perfect.accuracy == 1.0
    assert [b["distance"] for b in perfect.buckets] == ["1", "2-3", "4-7", "8-15", "16-20"]
    p = np.where((distances >= 4) & (distances <= 7), 0.79, 0.95)  # 0.79 < 0.8 in bucket 4-7 only
    result = wcpa_from_probabilities(p, distances, min_count=1)
    accuracy = {b["distance"]: b["accuracy"] for b in result.buckets}
    assert accuracy == {"1": 1.0, "2-3": 1.0, "4-7": 0.0, "8-15": 1.0, "16-20": 1.0}
    assert result.wcpa == 0.0 and result.accuracy == pytest.approx(0.7)
    exactly = wcpa_from_probabilities(np.full(30, 0.8), distances, min_count=1)
    assert exactly.wcpa == 1.0  # "at least 80%"
    half = np.where(np.arange(30) % 2 == 0, 0.9, 0.1)  # half right in every bucket but one
    half[distances == 20] = 0.9
    assert wcpa_from_probabilities(half, distances, edges=[1, 10], min_count=1).wcpa == pytest.approx(0.5)
    # buckets below min_count are listed but not in the worst case
    sparse = wcpa_from_probabilities(np.array([0.9] * 10 + [0.1]), np.array([1] * 10 + [40]), min_count=10)
    assert sparse.wcpa == 1.0 and sparse.buckets[-1]["count"] == 1


def _hand_set_dyck_rnn(m):
    """The report's Dyck-RNN for Dyck-2 with weights set by hand: push the bracket's value on top (gate 1
    for open brackets, 0 for closing ones), read the top: value 1 -> ')', value 2 -> ']'."""
    model = ClosingBracketModel(2, m, "dyck_rnn").double()
    with torch.no_grad():
        model.rnn.weight_gate_l0.fill_(40.0)  # g = sigmoid(40 x): 1 for +1, +2 (open), 0 for -1, -2 (close)
        model.rnn.weight_ih_l0.zero_()
        model.rnn.weight_ih_l0[0, 0] = 1.0  # h[0] = the pushed value
        model.readout.weight.copy_(torch.tensor([[-10.0], [10.0]]))  # logit(]) - logit()) = 20 (h0 - 1.5)
        model.readout.bias.copy_(torch.tensor([15.0, -15.0]))
    return model


@pytest.mark.parametrize("positions", ["closing", "open_stack"])
def test_a_hand_set_dyck_rnn_reaches_wcpa_100_on_dyck_2_depth_4(positions):
    sequences = DyckLanguage(2, 4).sample_many(100, (20, 120), seed=5)
    model = _hand_set_dyck_rnn(4)
    result = evaluate_wcpa(model, sequences, 2, torch.arange(4), 4, torch.arange(2), positions)
    assert result.wcpa == 1.0 and result.accuracy == 1.0 and result.xent < 1e-3
    assert max(b["max"] for b in result.buckets) >= 32  # long distances are in the test
    with torch.no_grad():  # and it is the readout that decides: swapped bracket values score 0
        model.readout.bias.mul_(-1)
        model.readout.weight.mul_(-1)
    assert evaluate_wcpa(model, sequences, 2, torch.arange(4), 4, torch.arange(2), positions).wcpa == 0.0


def test_closing_model_shapes_frozen_embedding_and_zero_gate():
    model = ClosingBracketModel(2, 4)
    assert not model.embedding.weight.requires_grad and model.embedding.weight.squeeze(1).tolist() == [1, 2, -1, -2, 0]
    assert model.rnn.weight_gate_l0.abs().sum() == 0 and not model.rnn.bias
    assert model(torch.zeros(7, 3, dtype=torch.long)).shape == (7, 3, 2)
    learned = ClosingBracketModel(2, 8, learned_embedding=True)
    assert learned.embedding.weight.shape == (5, 2) and learned.embedding.weight.requires_grad
    lstm = ClosingBracketModel(2, 6, "lstm")
    assert lstm.embedding.weight.shape == (5, 6) and lstm.read == 6
    with pytest.raises(MoglmError, match="learned 2-d"):
        DyckTraining("lstm", learned_embedding=True)


SMALL = dict(train_sequences=200, valid_sequences=40, test_sequences=40, train_lengths=(10, 40), test_lengths=(42, 60))


def test_the_dyck_rnn_learns_dyck_2_4_with_the_closing_objective(tmp_path):
    results = run_dyck(DyckTask(**SMALL), DyckTraining(steps=200, batch_size=32, learning_rate=0.05, eval_every=100),
                       tmp_path / "run",
                       progress=False, log=lambda s: None)
    assert results["wcpa"]["valid"]["accuracy"] > 0.97
    assert results["num_params"] == 4 + 1 + 2 + 2  # W_ih [4, 1], W_gate [1, 1], readout 1 -> 2
    assert json.loads((tmp_path / "run" / "results.json").read_text())["wcpa"]["test"]["predictions"] > 0


class Killed(Exception):
    """Stands in for SIGKILL right after a checkpoint."""


def test_closing_runs_resume_exactly_and_refuse_another_config(tmp_path, monkeypatch):
    task, training = DyckTask(**SMALL), DyckTraining(steps=20, batch_size=16, eval_every=5)
    straight = run_dyck(task, training, tmp_path / "a", progress=False, log=lambda s: None)
    prune = CheckpointStore.prune

    def prune_then_die(self):
        prune(self)
        if self.pointer("last")["step"] == 10:
            raise Killed

    monkeypatch.setattr(CheckpointStore, "prune", prune_then_die)
    with pytest.raises(Killed):
        run_dyck(task, training, tmp_path / "b", progress=False, log=lambda s: None)
    monkeypatch.undo()
    lines = []
    resumed = run_dyck(task, training, tmp_path / "b", progress=False, log=lines.append)
    assert "resuming" in lines[1] and resumed["wcpa"] == straight["wcpa"]

    def losses(run):
        return [(r["kind"], r["step"], r["xent"]) for r in RunDirectory(run).read_metrics()]

    assert losses(tmp_path / "b") == losses(tmp_path / "a")
    assert [r[:2] for r in losses(tmp_path / "a") if r[0] == "valid"] == [("valid", s) for s in (5, 10, 15, 20)]
    with pytest.raises(MoglmError, match="different config"):
        run_dyck(DyckTask(**{**SMALL, "max_depth": 6}), training, tmp_path / "a", progress=False, log=lambda s: None)


def test_a_language_model_trains_with_the_trainer_and_is_scored(tmp_path):
    results = run_dyck(DyckTask(**SMALL), DyckTraining("lstm", steps=40, batch_size=16, eval_every=20),
                       tmp_path / "lm", progress=False, log=lambda s: None)
    assert {"valid", "test"} <= set(results["splits"]) and results["wcpa"]["test"]["predictions"] > 0
    lm = tmp_path / "lm" / "lm"  # the language model's own run directory inside the task's
    kinds = {r["kind"] for r in map(json.loads, (lm / "metrics.jsonl").read_text().splitlines())}
    assert {"train", "valid", "valid_wcpa"} <= kinds
    model, _, vocab = LanguageModelRun(lm).load_model()
    again = lm_wcpa(model, vocab, read_sequences(tmp_path / "lm" / "data" / "test.txt", 2), DyckTask(**SMALL))
    assert again.as_dict() == results["wcpa"]["test"]
