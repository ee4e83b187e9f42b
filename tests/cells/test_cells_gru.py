"""moglm.GRU is a drop-in torch.nn.GRU: same names, outputs, final states and every gradient."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import moglm
from parity import assert_matches_reference

D = torch.float64


@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_gru_equals_torch_gru_outputs_states_and_all_gradients(num_layers, batch_first, bias):
    kw = dict(bias=bias, batch_first=batch_first, dtype=D)
    x = torch.randn((3, 6, 13) if batch_first else (6, 3, 13), dtype=D)
    h0 = torch.randn(num_layers, 3, 17, dtype=D)
    assert_matches_reference(moglm.GRU(13, 17, num_layers, **kw), nn.GRU(13, 17, num_layers, **kw), x, h0)


def test_gru_unbatched_matches_torch():
    x, h0 = torch.randn(4, 5, dtype=D), torch.randn(2, 7, dtype=D)
    assert_matches_reference(moglm.GRU(5, 7, 2, dtype=D), nn.GRU(5, 7, 2, dtype=D), x, h0)


def test_gru_step_is_the_r_z_n_equation():
    model = moglm.GRU(5, 4, dtype=D)
    with torch.no_grad():
        model.bias_hh_l0.normal_()
    x, h0 = torch.randn(1, 3, 5, dtype=D), torch.randn(1, 3, 4, dtype=D)
    _, h = model(x, h0)
    gi = x[0] @ model.weight_ih_l0.T + model.bias_ih_l0
    gh = h0[0] @ model.weight_hh_l0.T + model.bias_hh_l0
    r = torch.sigmoid(gi[:, :4] + gh[:, :4])
    z = torch.sigmoid(gi[:, 4:8] + gh[:, 4:8])
    n = torch.tanh(gi[:, 8:] + r * gh[:, 8:])
    torch.testing.assert_close(h[0], (1 - z) * n + z * h0[0])


def test_gru_paper_init_gives_the_update_gate_the_forget_bias_and_torch_init_its_range():
    model = moglm.GRU(400, 300, init="paper")
    assert abs(model.bias_ih_l0[300:600].mean().item() - 1.0) < 0.02  # z, the forget gate's counterpart
    assert abs(model.bias_ih_l0[:300].mean().item()) < 0.02
    assert model.bias_hh_l0.abs().max().item() == 0.0
    assert abs(model.weight_hh_l0.std().item() / (1 / 300) ** 0.5 - 0.88) < 0.03
    assert all(p.abs().max().item() <= 1 / 25**0.5 for p in moglm.GRU(10, 25, init="torch").parameters())
