"""Evaluation: scores, continuous-stream evaluation, the temperature search and MC dropout."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from moglm.evaluation import FACTORS, Scores, evaluate_mc_dropout, evaluate_stream, search_temperature
from moglm.evaluation.stream import evaluate_episodes
from moglm.model import LanguageModel


def _model(**kw):
    torch.manual_seed(0)
    args = dict(vocab_size=9, hidden_size=12, num_layers=2, architecture="mogrifier",
                cell_options={"rounds": 3, "rank": 3})
    args.update(kw)
    return LanguageModel(**args).double()


def test_scores_convert_between_nats_perplexity_and_bits():
    s = Scores(nll=10 * math.log(2), tokens=10, words=2)
    assert s.xent == pytest.approx(math.log(2)) and s.perplexity == pytest.approx(2.0)
    assert s.bits_per_token == pytest.approx(1.0) and s.bits_per_word == pytest.approx(5.0)
    assert s.headline("word") == "ppl 2.00 (xent 0.6931)"


@pytest.mark.parametrize("data_format,printed", [("word", "ppl 2.00"), ("char", "1.0000 bpc"),
                                                 ("ptb_char", "1.0000 bpc"), ("byte", "1.0000 bpb")])
def test_every_printed_score_is_in_its_corpus_unit_and_no_character_corpus_prints_bits_per_word(data_format, printed):
    """One choice of unit per corpus (evaluation.scores.unit_for) behind the final scores, the validation lines, the
    one-line headline of a results file and the learning curve; bits per word stays in results.json only."""
    from moglm.train.final_evaluation import headline
    from moglm.evaluation.scores import UNITS, unit_for

    s = Scores(nll=10 * math.log(2), tokens=10, words=2)
    assert s.headline(data_format).split(" (xent")[0] == printed and "word" not in s.headline(data_format)
    assert headline({"level": data_format, "splits": {"test": s.as_dict()}}, "test") == f"test {printed}"
    assert UNITS[unit_for(data_format)][1](UNITS[unit_for(data_format)][2](s.xent)) == printed
    assert s.as_dict()["bits_per_word"] == pytest.approx(5.0)


def test_batch_one_stream_evaluation_equals_scoring_every_token_in_one_pass():
    model = _model().eval()
    ids = np.random.default_rng(0).integers(0, 9, size=50)
    scores = evaluate_stream(model, ids, batch_size=1, bptt=7)  # windows carry the state across
    tokens = torch.as_tensor(ids)
    nll, _ = model.nll(tokens[:-1].view(-1, 1), tokens[1:].view(-1, 1))  # one window over everything
    assert scores.tokens == 49
    assert scores.nll == pytest.approx(float(nll.detach().sum()), rel=1e-12)


def test_episodic_evaluation_scores_each_line_from_a_zero_state():
    model = _model().eval()
    ids = np.array([3, 4, 0, 5, 6, 7, 0])  # two lines ending in separator 0
    scores = evaluate_episodes(model, ids, separator=0, batch_size=2)
    total = 0.0
    for line in ([3, 4, 0], [5, 6, 7, 0]):
        seq = torch.tensor([0] + line)
        total += float(model.nll(seq[:-1].view(-1, 1), seq[1:].view(-1, 1))[0].detach().sum())
    assert scores.tokens == 7 and scores.nll == pytest.approx(total, rel=1e-10)


def test_temperature_search_tries_factors_from_1_06_down_and_stops_after_two_misses():
    assert FACTORS[0] == 1.06 and FACTORS[-1] == 0.8 and len(FACTORS) == 14
    model = _model().eval()
    ids = np.random.default_rng(1).integers(0, 9, size=300)
    best, tried = search_temperature(model, ids, max_tokens=200, batch_size=2, bptt=10)
    assert best in tried and tried[best] == min(tried.values())
    order = list(tried)
    assert order == list(FACTORS[: len(order)])
    after_best = order[order.index(best) + 1 :]
    assert len(after_best) == 2 or order[-1] == 0.8  # two non-improvements end the search
    for f, xent in tried.items():  # each value is the real cross-entropy at that factor
        direct = evaluate_stream(model, ids, batch_size=2, bptt=10, factor=f, max_tokens=200)
        assert xent == pytest.approx(direct.xent, rel=1e-9)


def test_mc_dropout_averages_probabilities_over_samples_each_with_its_own_masks():
    model = _model(input_dropout=0.3, output_dropout=0.3, state_dropout=0.2)
    ids = np.random.default_rng(2).integers(0, 9, size=40)
    deterministic = evaluate_stream(model, ids, batch_size=1, bptt=10)
    with model.dropout_scaled(0.0):  # no dropout left: every sample is the deterministic model
        zero = evaluate_mc_dropout(model, ids, samples=3, multiplier=1.0, bptt=10)
    assert zero.nll == pytest.approx(deterministic.nll, rel=1e-10)
    torch.manual_seed(5)
    one = evaluate_mc_dropout(model, ids, samples=1, multiplier=0.8, bptt=10)
    torch.manual_seed(5)
    many = evaluate_mc_dropout(model, ids, samples=16, multiplier=0.8, bptt=10)
    assert one.nll != many.nll and math.isfinite(many.nll) and many.tokens == 39
    assert model.training and model.input_dropout == 0.3  # mode and rates restored


def test_the_mc_dropout_multiplier_search_picks_the_lowest_validation_cross_entropy():
    """Mogrifier paper 3.3: in the MC case the dropout rates are scaled, by a multiplier searched on validation."""
    import numpy as np
    import torch

    from moglm.evaluation.mc_dropout import evaluate_mc_dropout, search_multiplier
    from moglm.model.language_model import LanguageModel

    torch.manual_seed(0)
    model = LanguageModel(13, 10, 1, "lstm", input_dropout=0.5, output_dropout=0.5).eval()
    ids = np.random.default_rng(0).integers(0, 13, 200)
    best, scored = search_multiplier(model, ids, samples=3, bptt=20, tokens=120, candidates=(0.0, 0.5, 1.0))
    assert set(scored) == {"0.0", "0.5", "1.0"} and scored[str(best)] == min(scored.values())
    torch.manual_seed(0)
    again = evaluate_mc_dropout(model, ids, 3, best, 20, max_tokens=120).xent
    assert again == pytest.approx(scored[str(best)])  # each candidate from the same random state
    assert scored["0.0"] != scored["1.0"]
