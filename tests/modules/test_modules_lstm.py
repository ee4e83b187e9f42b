"""moglm.LSTM is a drop-in torch.nn.LSTM: same names, outputs, final states and every gradient."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import moglm
from conftest import assert_close_all

D = torch.float64


def _run_both(num_layers, batch_first, input_size=13, hidden=17, T=6, B=3):
    ref = nn.LSTM(input_size, hidden, num_layers, batch_first=batch_first, dtype=D)
    ours = moglm.LSTM(input_size, hidden, num_layers, batch_first=batch_first, dtype=D)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn((B, T, input_size) if batch_first else (T, B, input_size), dtype=D)
    h0 = torch.randn(num_layers, B, hidden, dtype=D)
    c0 = torch.randn(num_layers, B, hidden, dtype=D)
    results = []
    for model in (ref, ours):
        xi, hi, ci = (t.clone().requires_grad_() for t in (x, h0, c0))
        y, (h, c) = model(xi, (hi, ci))
        loss = (y * torch.linspace(-1, 1, y.numel(), dtype=D).view_as(y)).sum() + (h**2).sum() + (c**3).sum()
        loss.backward()
        grads = [xi.grad, hi.grad, ci.grad] + [p.grad for p in model.parameters()]
        results.append(([y, h, c], grads, [n for n, _ in model.named_parameters()]))
    return results


@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("batch_first", [False, True])
def test_lstm_equals_torch_lstm_outputs_states_and_all_gradients(num_layers, batch_first):
    (ref_out, ref_grads, ref_names), (out, grads, names) = _run_both(num_layers, batch_first)
    assert names == ref_names
    assert_close_all(out, ref_out)
    assert_close_all(grads, ref_grads)


def test_lstm_zero_initial_state_by_default_matches_torch():
    ref = nn.LSTM(5, 7, 2, dtype=D)
    ours = moglm.LSTM(5, 7, 2, dtype=D)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(4, 2, 5, dtype=D)
    assert_close_all(list(ours(x)[0:1]) + list(ours(x)[1]), list(ref(x)[0:1]) + list(ref(x)[1]))


def test_lstm_unbatched_input_matches_torch():
    ref = nn.LSTM(5, 7, 2, dtype=D)
    ours = moglm.LSTM(5, 7, 2, dtype=D)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(4, 5, dtype=D)
    h0, c0 = torch.randn(2, 7, dtype=D), torch.randn(2, 7, dtype=D)
    y, (h, c) = ours(x, (h0, c0))
    y_ref, (h_ref, c_ref) = ref(x, (h0, c0))
    assert y.shape == (4, 7) and h.shape == (2, 7)
    assert_close_all([y, h, c], [y_ref, h_ref, c_ref])


def test_lstm_capped_input_gate_is_min_of_one_minus_forget_and_input():
    model = moglm.LSTM(3, 4, capped_input_gate=True, dtype=D)
    x, h0, c0 = torch.randn(1, 2, 3, dtype=D), torch.randn(1, 2, 4, dtype=D), torch.randn(1, 2, 4, dtype=D)
    _, (h, c) = model(x, (h0, c0))
    gates = x[0] @ model.weight_ih_l0.T + h0[0] @ model.weight_hh_l0.T + model.bias_ih_l0 + model.bias_hh_l0
    i, f, j, o = gates.sigmoid()[:, :4], gates.sigmoid()[:, 4:8], gates[:, 8:12].tanh(), gates.sigmoid()[:, 12:]
    c_expected = f * c0[0] + torch.minimum(1 - f, i) * j
    torch.testing.assert_close(c[0], c_expected)
    torch.testing.assert_close(h[0], o * c_expected.tanh())
    # and it really differs from the plain LSTM on the same weights
    plain = moglm.LSTM(3, 4, dtype=D)
    plain.load_state_dict(model.state_dict())
    assert not torch.allclose(plain(x, (h0, c0))[1][1], c)


def test_paper_init_has_forget_bias_mean_one_and_fan_in_scale():
    model = moglm.LSTM(400, 300, init="paper")
    forget = model.bias_ih_l0[300:600]
    assert abs(forget.mean().item() - 1.0) < 0.02
    assert model.bias_hh_l0.abs().max().item() == 0.0
    w = model.weight_ih_l0
    # truncated normal at 2 std has std ~0.88 * sigma
    assert abs(w.std().item() / (1 / 400) ** 0.5 - 0.88) < 0.03
    assert w.abs().max().item() <= 2 * (1 / 400) ** 0.5 + 1e-6


def test_torch_init_matches_torch_lstm_range():
    model = moglm.LSTM(10, 25, init="torch")
    bound = 1 / 25**0.5
    for p in model.parameters():
        assert p.abs().max().item() <= bound
