"""The language model: heads (tied, untied, down-projection, mixture of softmaxes), skip sum, sizing."""

from __future__ import annotations

import pytest
import torch

from moglm.model import LanguageModel, MixtureOfSoftmaxes, count_parameters, embedding_size, largest_hidden_size
from moglm.model.sizing import count_on_meta

D = torch.float64


def _lm(**kw):
    args = dict(vocab_size=11, hidden_size=8, num_layers=2, architecture="mogrifier", cell_options={"rounds": 2, "rank": 2})
    args.update(kw)
    return LanguageModel(**args).to(D)


def test_tied_embeddings_share_one_matrix_and_untied_have_their_own():
    tied, untied = _lm(tie_embeddings=True), _lm(tie_embeddings=False)
    assert tied.decoder_weight is tied.embedding.weight
    assert untied.decoder_weight is not untied.embedding.weight
    assert count_parameters(untied) - count_parameters(tied) == 11 * 8


def test_embedding_ratio_below_one_adds_a_bias_free_orthogonal_down_projection():
    assert embedding_size(100, 0.25) == 25 and embedding_size(100, 1.7) == 100 and embedding_size(10, 0.0) == 1
    model = _lm(input_embedding_ratio=0.5)
    proj = model.head.projection
    assert model.embedding.weight.shape == (11, 4) and proj.bias is None and proj.weight.shape == (4, 8)
    torch.testing.assert_close(proj.weight @ proj.weight.T, torch.eye(4, dtype=D), rtol=0, atol=1e-6)
    assert _lm(input_embedding_ratio=1.0).head.projection is None


def test_skip_sum_output_is_the_sum_of_all_layer_outputs():
    model = _lm(skip_sum=True).eval()
    tokens = torch.randint(0, 11, (5, 3))
    h, _ = model(tokens)
    layers, _ = model.rnn.forward_layers(model.embedding(tokens))
    torch.testing.assert_close(h, layers[0] + layers[1])
    last = _lm(skip_sum=False).eval()
    last.load_state_dict(model.state_dict())
    torch.testing.assert_close(last(tokens)[0], layers[1])


def test_nll_equals_the_log_softmax_of_the_logits():
    model = _lm().eval()
    tokens, targets = torch.randint(0, 11, (5, 3)), torch.randint(0, 11, (5, 3))
    nll, _ = model.nll(tokens, targets)
    lp, _ = model.log_probs(tokens)
    torch.testing.assert_close(nll, -lp.gather(2, targets.unsqueeze(-1)).squeeze(-1))
    torch.testing.assert_close(lp.exp().sum(-1), torch.ones(5, 3, dtype=D))


def test_mixture_of_softmaxes_mixes_component_softmaxes_in_probability_space():
    model = _lm(mos_components=3, input_embedding_ratio=0.5).eval()
    assert isinstance(model.head, MixtureOfSoftmaxes)
    h = torch.randn(4, 8, dtype=D)
    head, w = model.head, model.decoder_weight
    comps = torch.tanh(h @ head.component.weight.T + head.component.bias).view(4, 3, 4)
    probs = torch.softmax(comps @ w.T + head.bias, dim=-1)  # [4, 3, V]
    prior = torch.softmax(h @ head.prior.weight.T, dim=-1)  # [4, 3]
    expected = (prior.unsqueeze(-1) * probs).sum(1)
    torch.testing.assert_close(head.log_probs(h, w).exp(), expected)
    torch.testing.assert_close(head.log_probs(h, w, 0.9).exp().sum(-1), torch.ones(4, dtype=D))


def test_logit_factor_scales_the_logits():
    model = _lm().eval()
    h = torch.randn(4, 8, dtype=D)
    logits = model.head.logits(h, model.decoder_weight)
    torch.testing.assert_close(model.head.log_probs(h, model.decoder_weight, 0.8), torch.log_softmax(0.8 * logits, -1))


def test_dropout_scaled_multiplies_every_rate_and_restores_them():
    model = _lm(input_dropout=0.5, inter_layer_dropout=0.4, state_dropout=0.2, output_dropout=0.6)
    with model.dropout_scaled(0.5):
        assert (model.input_dropout, model.rnn.dropout, model.rnn.state_dropout, model.output_dropout,
                model.head.dropout) == (0.25, 0.2, 0.1, 0.3, 0.3)
    assert (model.input_dropout, model.rnn.dropout, model.rnn.state_dropout, model.output_dropout) == (0.5, 0.4, 0.2, 0.6)


def test_budget_sizing_picks_the_largest_hidden_size_that_fits():
    def build(h):
        return LanguageModel(1000, h, 2, "mogrifier", {"rounds": 5, "rank": 16}, input_embedding_ratio=0.5)

    h = largest_hidden_size(2_000_000, build)
    assert count_on_meta(build, h) <= 2_000_000 < count_on_meta(build, h + 1)


@pytest.mark.parametrize(
    "vocab, budget, arch, cell, ratio, mos, paper_hidden",
    [
        (10_000, 24_000_000, "mogrifier", {"rounds": 5, "rank": 84}, 1.0, 1, 912),  # PTB (docs/method.md)
        (33_278, 35_000_000, "mogrifier", {"rounds": 6, "rank": 48}, 272 / 1366, 2, 1366),  # WikiText-2
    ],
)
def test_budget_sizing_reproduces_the_papers_hidden_sizes(vocab, budget, arch, cell, ratio, mos, paper_hidden):
    def build(h):
        return LanguageModel(vocab, h, 2, arch, cell, input_embedding_ratio=ratio, mos_components=mos)

    assert abs(largest_hidden_size(budget, build) - paper_hidden) <= 1
