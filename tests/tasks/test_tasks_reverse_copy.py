"""Reverse copy (Mogrifier paper 4.3): the data, the masked loss, the encoder-decoder's state hand-over, and a
tiny model that learns a short length."""

from __future__ import annotations

import json

import pytest
import torch

from moglm.errors import MoglmError
from moglm.tasks.reverse_copy import (
    EncoderDecoder,
    ReverseCopyConfig,
    build_model,
    decoder_io,
    evaluate,
    run_reverse_copy,
    sample_sources,
)


def test_targets_are_the_reversed_sources_after_a_marker():
    sources = sample_sources(torch.Generator().manual_seed(0), 6, 5, 8)  # [T, B]
    assert sources.shape == (5, 6) and 0 <= sources.min() and sources.max() < 8
    inputs, targets = decoder_io(sources, marker=8)
    for b in range(6):
        assert targets[:, b].tolist() == sources[:, b].tolist()[::-1]
        assert inputs[:, b].tolist() == [8] + targets[:-1, b].tolist()  # teacher forcing from the marker
    again = sample_sources(torch.Generator().manual_seed(0), 6, 5, 8)
    assert torch.equal(sources, again)


def test_the_loss_covers_the_decoded_part_only_and_the_decoder_starts_from_the_encoder_state():
    torch.manual_seed(0)
    model = EncoderDecoder(8, 12, "lstm")
    sources = sample_sources(torch.Generator().manual_seed(1), 4, 5, 8)  # [T, B]
    nll, predicted, targets = model.loss(sources)
    assert nll.shape == predicted.shape == targets.shape == (5, 4)  # one loss per decoded token, none for the input
    inputs, _ = decoder_io(sources, 8)
    logits = model(sources, inputs)
    expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
    torch.testing.assert_close(nll.flatten(), expected)
    # the decoder starts from the encoder's final state: other sources change the decoded distribution
    other = sample_sources(torch.Generator().manual_seed(2), 4, 5, 8)
    assert not torch.allclose(model(other, inputs), logits)
    # and the encoder's final state is all it sees of the sources
    h, state = model.encoder(model.encoder_embedding(sources))
    decoded, _ = model.decoder(model.decoder_embedding(inputs), state)
    torch.testing.assert_close(model.output(decoded), logits)


def test_equal_budgets_and_architectures():
    lstm = build_model(ReverseCopyConfig(architecture="lstm", num_params=20_000, vocab_size=16))
    mog = build_model(ReverseCopyConfig(architecture="mogrifier", num_params=20_000, vocab_size=16,
                                        cell={"rounds": 3, "rank": 4}))
    for model in (lstm, mog):
        assert 18_000 < sum(p.numel() for p in model.parameters()) <= 20_000
    assert mog.output.in_features < lstm.output.in_features  # the mogrifier spends parameters on its rounds
    gru = EncoderDecoder(8, 6, "gru")
    assert gru(torch.zeros(3, 2, dtype=torch.long), torch.zeros(3, 2, dtype=torch.long)).shape == (3, 2, 8)
    with pytest.raises(MoglmError, match="exactly one"):
        ReverseCopyConfig(hidden_size=10, num_params=100)


def test_a_tiny_encoder_decoder_learns_length_5_of_8_tokens(tmp_path):
    cfg = ReverseCopyConfig(length=5, vocab_size=8, architecture="lstm", num_params=None, hidden_size=32, steps=300,
                            batch_size=32, learning_rate=0.01, eval_every=100, valid_examples=200,
                            test_examples=200)
    results = run_reverse_copy(cfg, tmp_path / "run", progress=False, log=lambda s: None)
    test = results["splits"]["test"]
    assert test["xent"] < 0.3 and test["sequence_accuracy"] > 0.6  # from log(8) = 2.08 nats per token
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["splits"]["test"] == test and saved["num_params"] == results["num_params"]
    records = map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
    metrics = [m for m in records if m["kind"] == "valid"]
    assert [m["step"] for m in metrics] == [100, 200, 300] and metrics[0]["xent"] > metrics[-1]["xent"]
    # rerunning the finished run trains no further and gives the same numbers
    again = run_reverse_copy(cfg, tmp_path / "run", progress=False, log=lambda s: None)
    assert again["splits"] == results["splits"]
    with pytest.raises(MoglmError, match="different config"):
        run_reverse_copy(ReverseCopyConfig(**{**cfg.__dict__, "length": 6}), tmp_path / "run", progress=False,
                         log=lambda s: None)


def test_exact_sequence_accuracy_is_all_tokens_right():
    model = EncoderDecoder(4, 8, "rnn")
    sources = sample_sources(torch.Generator().manual_seed(3), 10, 3, 4)
    scores = evaluate(model, sources)
    _, predicted, targets = model.loss(sources)
    assert scores["sequence_accuracy"] == (predicted == targets).all(0).float().mean().item()
    assert scores["token_accuracy"] == pytest.approx((predicted == targets).float().mean().item())


# -- the paper's setup: a fixed training set, variable lengths, scores per length ------------------------
def _tiny(**kw):
    base = dict(vocab_size=6, architecture="lstm", num_params=None, hidden_size=8, steps=12, batch_size=8,
                learning_rate=0.01, eval_every=6, valid_examples=24, test_examples=24)
    return ReverseCopyConfig(**{**base, **kw})


def test_a_fixed_training_set_is_deterministic_and_every_epoch_visits_each_example_once():
    from moglm.tasks.reverse_copy import TrainingSet

    cfg = _tiny(min_length=2, max_length=5, train_examples=30)
    a, b = TrainingSet(cfg), TrainingSet(cfg)
    assert a.batches_per_epoch == sum(-(-n // 8) for n in a.counts) and sum(a.counts) == 30
    steps = range(1, 3 * a.batches_per_epoch + 1)
    for step in steps:
        assert torch.equal(a.batch(step), b.batch(step))  # a function of (seed, step): resuming needs no data
    for epoch in range(3):
        batches = a.epoch(epoch)
        seen = torch.cat(batches).sort().values
        assert seen.tolist() == list(range(30))  # every example once per epoch
        for batch in batches:
            assert len(set(a.lengths[batch].tolist())) == 1 and len(batch) <= 8  # one length per batch
    assert [t.tolist() for t in a.epoch(0)] != [t.tolist() for t in a.epoch(1)]  # a new order every epoch
    for i in range(30):  # an example is the same whenever it is drawn
        assert torch.equal(a.example(i), b.example(i)) and len(a.example(i)) == int(a.lengths[i])
    # the fixed set repeats: the same example in two epochs has the same tokens
    first = {tuple(x.tolist()) for s in range(1, a.batches_per_epoch + 1) for x in a.batch(s).T}
    second = {tuple(x.tolist()) for s in range(a.batches_per_epoch + 1, 2 * a.batches_per_epoch + 1)
              for x in a.batch(s).T}
    assert first == second


def test_a_fixed_training_set_resumes_exactly(tmp_path):
    cfg = _tiny(min_length=2, max_length=4, train_examples=20)
    quiet = dict(progress=False, log=lambda s: None)
    whole = run_reverse_copy(cfg, tmp_path / "whole", **quiet)

    class Killed(Exception):
        pass

    def kill(evaluation):
        if evaluation.step == 6:
            raise Killed  # after the step-6 checkpoint

    with pytest.raises(Killed):
        run_reverse_copy(cfg, tmp_path / "resumed", on_evaluation=kill, **quiet)
    resumed = run_reverse_copy(cfg, tmp_path / "resumed", **quiet)
    assert resumed["splits"] == whole["splits"]
    valid = [json.loads(line) for line in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in valid if m["kind"] == "valid"] == [6, 12]


@pytest.mark.parametrize("architecture,cell", [("lstm", {}), ("mogrifier", {"rounds": 3, "rank": 2})])
@pytest.mark.parametrize("train_examples", [None, 40])
def test_variable_lengths_train_and_score_per_length(tmp_path, architecture, cell, train_examples):
    cfg = _tiny(architecture=architecture, cell=cell, min_length=2, max_length=5, train_examples=train_examples,
                valid_examples=22, test_examples=22)
    assert cfg.length is None and cfg.length_label == "2-5"
    results = run_reverse_copy(cfg, tmp_path / "run", progress=False, log=lambda s: None)
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["splits"] == results["splits"]
    for split in ("valid", "test"):
        scores = results["splits"][split]
        by_length = scores["by_length"]
        assert list(by_length) == ["2", "3", "4", "5"]  # the range covered evenly: 22 = 6 + 6 + 5 + 5
        assert [by_length[k]["examples"] for k in by_length] == [6, 6, 5, 5] and scores["examples"] == 22
        tokens = {int(k): v["examples"] * int(k) for k, v in by_length.items()}
        weighted = sum(by_length[str(n)]["xent"] * t for n, t in tokens.items()) / sum(tokens.values())
        assert weighted == pytest.approx(scores["xent"], rel=1e-12)
        accuracy = sum(by_length[str(n)]["token_accuracy"] * t for n, t in tokens.items()) / sum(tokens.values())
        assert accuracy == pytest.approx(scores["token_accuracy"])
        exact = sum(v["sequence_accuracy"] * v["examples"] for v in by_length.values()) / 22
        assert exact == pytest.approx(scores["sequence_accuracy"])
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all("by_length" not in r for r in records)  # per-length scores are in the results only


def test_fresh_batches_draw_one_length_per_step_and_a_fixed_length_is_unchanged():
    from moglm.tasks.reverse_copy import fresh_batch, split_sources

    cfg = _tiny(min_length=2, max_length=5)
    lengths = {fresh_batch(cfg, step).shape[0] for step in range(1, 60)}
    assert lengths == {2, 3, 4, 5}
    assert torch.equal(fresh_batch(cfg, 7), fresh_batch(cfg, 7))
    fixed = _tiny(length=4)  # the pre-range behaviour: same batches and validation set as before
    old = torch.Generator().manual_seed(fixed.seed * (1 << 42) + 3)
    assert torch.equal(fresh_batch(fixed, 3), sample_sources(old, 8, 4, 6))
    (valid,) = split_sources(fixed, "valid")
    assert torch.equal(valid, sample_sources(torch.Generator().manual_seed((1 << 42) + (1 << 40)), 24, 4, 6))
    from moglm.runs.directory import plain

    assert not {"min_length", "max_length", "train_examples"} & set(plain(fixed.__dict__))  # old run dirs resume


def test_length_settings_are_checked():
    with pytest.raises(MoglmError, match="both min_length and max_length"):
        _tiny(min_length=3)
    with pytest.raises(MoglmError, match="must be <= max_length"):
        _tiny(min_length=5, max_length=3)
    with pytest.raises(MoglmError, match="train_examples must be >= 1"):
        _tiny(train_examples=0)
    assert _tiny(length=7).lengths == (7, 7) and _tiny(min_length=3, max_length=9).lengths == (3, 9)
