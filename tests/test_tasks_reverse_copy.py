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
