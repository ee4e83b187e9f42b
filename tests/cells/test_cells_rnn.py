"""moglm.RNN is a drop-in torch.nn.RNN; the multiplicative RNN follows Krause's thesis eq. 2.26-2.28."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import moglm
from parity import assert_matches_reference

D = torch.float64


@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
def test_rnn_equals_torch_rnn_outputs_states_and_all_gradients(num_layers, batch_first, nonlinearity):
    kw = dict(nonlinearity=nonlinearity, batch_first=batch_first, dtype=D)
    x = torch.randn((3, 6, 13) if batch_first else (6, 3, 13), dtype=D)
    h0 = torch.randn(num_layers, 3, 17, dtype=D)
    ours, ref = moglm.RNN(13, 17, num_layers, **kw), nn.RNN(13, 17, num_layers, **kw)
    assert_matches_reference(ours, ref, x, h0)


def test_rnn_without_bias_unbatched_and_zero_state_match_torch():
    ours, ref = moglm.RNN(5, 7, 2, bias=False, dtype=D), nn.RNN(5, 7, 2, bias=False, dtype=D)
    assert_matches_reference(ours, ref, torch.randn(4, 5, dtype=D), torch.randn(2, 7, dtype=D))  # unbatched
    x = torch.randn(4, 2, 5, dtype=D)
    y, h = ours(x)
    y_ref, h_ref = ref(x)
    assert isinstance(h, torch.Tensor) and h.shape == (2, 2, 7)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(h, h_ref)


def test_rnn_step_is_the_elman_equation():
    model = moglm.RNN(5, 7, dtype=D)
    with torch.no_grad():
        model.bias_hh_l0.normal_()
    x, h0 = torch.randn(1, 3, 5, dtype=D), torch.randn(1, 3, 7, dtype=D)
    _, h = model(x, h0)
    ref = torch.tanh(x[0] @ model.weight_ih_l0.T + model.bias_ih_l0 + h0[0] @ model.weight_hh_l0.T + model.bias_hh_l0)
    torch.testing.assert_close(h[0], ref)


def test_multiplicative_rnn_step_follows_the_thesis_equations():
    model = moglm.MultiplicativeRNN(5, 7, 2, dtype=D)
    with torch.no_grad():
        model.bias_hh_l0.normal_()
    x, h0 = torch.randn(2, 3, 5, dtype=D), torch.randn(2, 3, 7, dtype=D)
    y, h_n = model(x, h0)
    xs, finals = x, []
    for k in range(2):
        names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_mx", "weight_mh")
        p = {n: getattr(model, f"{n}_l{k}") for n in names}
        h, outs = h0[k], []
        for x_t in xs:
            w_hh = p["weight_hh"] @ torch.diag_embed(x_t @ p["weight_mx"].T) @ p["weight_mh"]  # eq. 2.26, [B, H, H]
            m = (x_t @ p["weight_mx"].T) * (h @ p["weight_mh"].T)  # eq. 2.27
            h_hat = m @ p["weight_hh"].T + x_t @ p["weight_ih"].T + p["bias_ih"] + p["bias_hh"]  # eq. 2.28
            torch.testing.assert_close(torch.einsum("bij,bj->bi", w_hh, h), m @ p["weight_hh"].T)
            h = torch.tanh(h_hat)
            outs.append(h)
        xs = torch.stack(outs)
        finals.append(h)
    torch.testing.assert_close(y, xs)
    torch.testing.assert_close(h_n, torch.stack(finals))


@pytest.mark.parametrize("bias", [True, False])
def test_rnn_and_multiplicative_rnn_parameter_counts(bias):
    m, n = 11, 9
    rnn = n * (m + n) + bias * 2 * n + n * (n + n) + bias * 2 * n  # two layers of torch.nn.RNN
    assert sum(p.numel() for p in moglm.RNN(m, n, 2, bias=bias).parameters()) == rnn
    mrnn = rnn + (n * m + n * n) + (n * n + n * n)  # + W_mx, W_mh per layer
    assert sum(p.numel() for p in moglm.MultiplicativeRNN(m, n, 2, bias=bias).parameters()) == mrnn


def test_rnn_paper_and_torch_initialisation():
    model = moglm.RNN(400, 300, init="paper")
    assert model.bias_hh_l0.abs().max().item() == 0.0
    assert abs(model.weight_ih_l0.std().item() / (1 / 400) ** 0.5 - 0.88) < 0.03  # truncated at 2 std
    assert abs(model.weight_hh_l0.std().item() / (1 / 300) ** 0.5 - 0.88) < 0.03
    mrnn = moglm.MultiplicativeRNN(400, 300, init="paper")
    assert abs(mrnn.weight_mx_l0.std().item() / (1 / 400) ** 0.5 - 0.88) < 0.03
    for model in (moglm.RNN(10, 25, init="torch"), moglm.MultiplicativeRNN(10, 25, init="torch")):
        assert all(p.abs().max().item() <= 1 / 25**0.5 for p in model.parameters())
