"""Mogrifier GRU and Mogrifier Elman RNN: mogrified inputs into the GRU / Elman step, h_prev carried unmogrified
through the GRU's interpolation, and exactly torch.nn.GRU / torch.nn.RNN with zero rounds."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import moglm
from parity import assert_matches_reference
from test_cells_mogrifier import _by_hand, _randomise_biases

D = torch.float64


@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("batch_first", [False, True])
def test_rounds_zero_equals_torch_gru_and_rnn(num_layers, batch_first):
    x = torch.randn((3, 6, 13) if batch_first else (6, 3, 13), dtype=D)
    h0 = torch.randn(num_layers, 3, 17, dtype=D)
    kw = dict(batch_first=batch_first, dtype=D)
    ours = moglm.MogrifierGRU(13, 17, num_layers, rounds=0, **kw)
    assert_matches_reference(ours, nn.GRU(13, 17, num_layers, **kw), x, h0)
    for nonlinearity in ("tanh", "relu"):
        ours = moglm.MogrifierRNN(13, 17, num_layers, rounds=0, nonlinearity=nonlinearity, **kw)
        assert_matches_reference(ours, nn.RNN(13, 17, num_layers, nonlinearity=nonlinearity, **kw), x, h0)


@pytest.mark.parametrize("rounds", [1, 4, 5])
@pytest.mark.parametrize("zigzag", [True, False])
def test_mogrifier_gru_gates_on_mogrified_inputs_and_interpolates_to_the_raw_h_prev(rounds, zigzag):
    model = moglm.MogrifierGRU(7, 5, rounds=rounds, rank=2, zigzag=zigzag, dtype=D)
    _randomise_biases(model)
    x, h0 = torch.randn(1, 3, 7, dtype=D), torch.randn(1, 3, 5, dtype=D)
    _, h = model(x, h0)
    x_up, h_up = _by_hand(model, x[0], h0[0], rounds, zigzag)
    gi = x_up @ model.weight_ih_l0.T + model.bias_ih_l0
    gh = h_up @ model.weight_hh_l0.T + model.bias_hh_l0
    r, z = torch.sigmoid(gi[:, :5] + gh[:, :5]), torch.sigmoid(gi[:, 5:10] + gh[:, 5:10])
    n = torch.tanh(gi[:, 10:] + r * gh[:, 10:])
    torch.testing.assert_close(h[0], (1 - z) * n + z * h0[0])
    if rounds > 1:  # h was mogrified: interpolating to h_up would be a different cell
        assert not torch.allclose(h[0], (1 - z) * n + z * h_up)


@pytest.mark.parametrize("rounds", [2, 5])
def test_mogrifier_rnn_is_the_elman_step_on_mogrified_inputs(rounds):
    model = moglm.MogrifierRNN(7, 5, rounds=rounds, rank=0, dtype=D)
    _randomise_biases(model)
    x, h0 = torch.randn(1, 3, 7, dtype=D), torch.randn(1, 3, 5, dtype=D)
    _, h = model(x, h0)
    x_up, h_up = _by_hand(model, x[0], h0[0], rounds, True)
    pre = x_up @ model.weight_ih_l0.T + model.bias_ih_l0 + h_up @ model.weight_hh_l0.T + model.bias_hh_l0
    torch.testing.assert_close(h[0], torch.tanh(pre))


@pytest.mark.parametrize("make, reference", [(moglm.MogrifierGRU, moglm.GRU), (moglm.MogrifierRNN, moglm.RNN)])
def test_unit_round_gates_make_the_mogrifier_exactly_the_plain_cell(make, reference):
    model = make(13, 17, 2, rounds=5, rank=4, dtype=D)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("mogrifier") and ("left" in name or "bias" in name):
                p.zero_()
    plain = reference(13, 17, 2, dtype=D)
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("mogrifier")})
    x = torch.randn(6, 3, 13, dtype=D)
    torch.testing.assert_close(model(x)[0], plain(x)[0])


@pytest.mark.parametrize("rounds", [0, 3, 6])
@pytest.mark.parametrize("rank", [3, 0])
def test_parameter_counts_match_the_formula(rounds, rank):
    m, n = 11, 9
    extra = 0
    for inp in (m, n):  # two layers
        nq, nr = math.ceil(rounds / 2), rounds // 2
        q, r = (rank * (inp + n) + inp, rank * (n + inp) + n) if rank > 0 else (inp * n + inp, n * inp + n)
        extra += nq * q + nr * r
    gru = sum(p.numel() for p in nn.GRU(m, n, 2).parameters())
    rnn = sum(p.numel() for p in nn.RNN(m, n, 2).parameters())
    assert sum(p.numel() for p in moglm.MogrifierGRU(m, n, 2, rounds=rounds, rank=rank).parameters()) == gru + extra
    assert sum(p.numel() for p in moglm.MogrifierRNN(m, n, 2, rounds=rounds, rank=rank).parameters()) == rnn + extra


def test_mogrify_and_round_matrices_for_analysis():
    model = moglm.MogrifierGRU(5, 7, 2, rounds=3, rank=2, dtype=D)
    _randomise_biases(model)
    x, h = torch.randn(2, 5, dtype=D), torch.randn(2, 7, dtype=D)
    for got, expected in zip(model.mogrify(x, h), _by_hand(model, x, h, 3, True)):
        torch.testing.assert_close(got, expected)
    assert [tuple(q.shape) for q in model.round_matrices(layer=1)] == [(7, 7)] * 3
    assert (model.rounds, model.rank, model.zigzag) == (3, 2, True)
    with pytest.raises(ValueError, match="x"):
        model.mogrify(torch.randn(2, 7, dtype=D), h)
    with pytest.raises(ValueError, match="h"):
        model.mogrify(x, torch.randn(2, 5, dtype=D))
    with pytest.raises(ValueError, match="layer"):
        model.round_matrices(layer=2)
