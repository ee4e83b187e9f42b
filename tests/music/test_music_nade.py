"""The NADE output layer (thesis 2.6.1) and the RNN-NADE (2.6.2): exact normalisation, the vectorised
conditionals against the plain loop, and the sequence model's contract."""

import itertools

import pytest
import torch

from moglm.music.model import NadeSequenceModel
from moglm.music.nade import NADE


def all_frames(d: int) -> torch.Tensor:
    return torch.tensor(list(itertools.product([0.0, 1.0], repeat=d)), dtype=torch.float64)  # [2^d, d]


@pytest.mark.parametrize("activation", ["sigmoid", "relu"])
@pytest.mark.parametrize("d", [1, 5, 10])
def test_nade_probabilities_of_all_2_to_the_d_frames_sum_to_one(d, activation):
    torch.manual_seed(d)
    nade = NADE(d, 7, activation).double()
    with torch.no_grad():  # large weights, so a wrong conditional would not sum to one by accident
        nade.weight_in.normal_(0, 2)
        nade.weight_out.normal_(0, 2)
    frames = all_frames(d)
    b_h, b_y = torch.randn(7, dtype=torch.float64), torch.randn(d, dtype=torch.float64)
    log_p = nade.log_prob(frames, b_h.expand(len(frames), 7), b_y.expand(len(frames), d))  # [2^d]
    assert torch.logsumexp(log_p, 0).exp().item() == pytest.approx(1.0, abs=1e-12)
    if d >= 5:
        assert log_p.std() > 0.5  # not uniform: the weights matter


def test_nade_with_a_temperature_factor_still_sums_to_one():
    torch.manual_seed(0)
    nade = NADE(6, 5).double()
    frames = all_frames(6)
    b_h, b_y = torch.randn(len(frames), 5).double(), torch.randn(len(frames), 6).double()
    b_h, b_y = b_h[:1].expand_as(b_h), b_y[:1].expand_as(b_y)
    assert torch.logsumexp(nade.log_prob(frames, b_h, b_y, factor=0.7), 0).exp().item() == pytest.approx(1.0)


@pytest.mark.parametrize("activation", ["sigmoid", "relu"])
def test_vectorised_conditionals_match_the_plain_loop_in_value_and_every_gradient(activation):
    torch.manual_seed(3)
    nade = NADE(13, 9, activation).double()
    x = (torch.rand(4, 3, 13) < 0.3).double()  # odd sizes
    b_h = torch.randn(4, 3, 9, dtype=torch.float64, requires_grad=True)
    b_y = torch.randn(4, 3, 13, dtype=torch.float64, requires_grad=True)
    fast = nade.log_prob(x, b_h, b_y)
    grads_fast = torch.autograd.grad(fast.sum(), [b_h, b_y, *nade.parameters()])
    slow = nade.log_prob_reference(x, b_h, b_y)
    grads_slow = torch.autograd.grad(slow.sum(), [b_h, b_y, *nade.parameters()])
    torch.testing.assert_close(fast, slow)
    for a, b in zip(grads_fast, grads_slow):
        torch.testing.assert_close(a, b)


def test_nade_samples_follow_its_distribution():
    torch.manual_seed(1)
    nade = NADE(3, 4).double()
    with torch.no_grad():
        nade.weight_in.normal_(0, 2)
        nade.weight_out.normal_(0, 2)
    frames = all_frames(3)
    b_h, b_y = torch.randn(4).double(), torch.randn(3).double()
    p = nade.log_prob(frames, b_h.expand(8, 4), b_y.expand(8, 3)).exp()  # [8]
    draws = nade.sample(b_h.expand(20000, 4), b_y.expand(20000, 3), torch.Generator().manual_seed(0))  # [N, 3]
    index = (draws * torch.tensor([4.0, 2.0, 1.0], dtype=torch.float64)).sum(-1).long()
    empirical = torch.bincount(index, minlength=8).double() / 20000
    torch.testing.assert_close(empirical, p, atol=0.015, rtol=0)


def test_nade_dropout_masks_each_frames_hidden_units_and_is_off_in_eval():
    torch.manual_seed(0)
    nade = NADE(6, 50, activation="sigmoid", dropout=0.5)
    x, b_h, b_y = (torch.rand(2, 6) < 0.5).float(), torch.randn(2, 50), torch.randn(2, 6)
    nade.eval()
    assert torch.equal(nade.log_prob(x, b_h, b_y), nade.log_prob(x, b_h, b_y))
    nade.train()
    assert not torch.equal(nade.log_prob(x, b_h, b_y), nade.log_prob(x, b_h, b_y))
    torch.manual_seed(1)
    logits = nade.logits(x, b_h, b_y)  # [2, 6]
    torch.manual_seed(1)
    mask = nade._mask(torch.empty(2, 6, 50))  # [2, 1, 50]: the mask the call above drew
    assert mask.shape == (2, 1, 50) and (mask == 0).any()
    contributions = x.unsqueeze(-1) * nade.weight_in.t()  # [2, 6, 50]
    h = torch.sigmoid(b_h.unsqueeze(1) + contributions.cumsum(1) - contributions) * mask  # one mask per frame
    torch.testing.assert_close(logits, (h * nade.weight_out).sum(-1) + b_y)


@pytest.mark.parametrize("architecture", ["lstm", "mogrifier", "rnn"])
def test_rnn_nade_frame_likelihood_is_normalised_given_the_history(architecture):
    """Every frame's conditional, given any history, sums to one over all 2^D frames (D = 6)."""
    torch.manual_seed(0)
    options = {"rounds": 3} if architecture == "mogrifier" else {}
    model = NadeSequenceModel(8, 2, architecture, options, visible=6, embedding_size=5, nade_hidden=7).double().eval()
    history = (torch.rand(3, 1, 6) < 0.4).double()  # [3, 1, 6]
    candidates = all_frames(6)  # [64, 6]
    inputs = torch.cat([torch.zeros(1, 1, 6, dtype=torch.float64), history]).expand(-1, 64, -1)  # [4, 64, 6]
    targets = torch.cat([history.expand(-1, 64, -1), candidates.unsqueeze(0)])  # [4, 64, 6]
    nll, _ = model.nll(inputs, targets)  # [4, 64]
    assert torch.logsumexp(-nll[-1], 0).exp().item() == pytest.approx(1.0, abs=1e-12)
    assert torch.allclose(nll[:-1], nll[:-1, :1])  # the history's own scores do not depend on the candidate


def test_rnn_nade_state_carried_across_windows_equals_one_pass():
    torch.manual_seed(0)
    model = NadeSequenceModel(10, 2, "lstm", visible=12, nade_hidden=6).double().eval()
    frames = (torch.rand(9, 2, 12) < 0.3).double()
    inputs = torch.cat([torch.zeros(1, 2, 12, dtype=torch.float64), frames[:-1]])
    whole, _ = model.nll(inputs, frames)
    first, state = model.nll(inputs[:4], frames[:4])
    second, _ = model.nll(inputs[4:], frames[4:], state)
    torch.testing.assert_close(torch.cat([first, second]), whole)


def test_rnn_nade_samples_binary_frames_continuing_a_prompt():
    torch.manual_seed(0)
    model = NadeSequenceModel(10, 1, "lstm", visible=12, nade_hidden=6)
    prompt = (torch.rand(4, 12) < 0.3).float()
    a = model.sample(5, prompt, torch.Generator().manual_seed(1))
    b = model.sample(5, prompt, torch.Generator().manual_seed(1))
    assert a.shape == (5, 12) and torch.equal(a, b) and set(a.unique().tolist()) <= {0.0, 1.0}
    assert model.training  # restored
