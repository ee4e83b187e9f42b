"""The Mogrifier follows the paper's equations (1)-(2), reduces to the LSTM, and warm-starts from one."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import moglm

D = torch.float64


def _dense(model, kind, j, layer=0):
    """Round matrix j of kind 'q' or 'r' written out from the raw parameters."""
    if hasattr(model, f"mogrifier_{kind}_weight_l{layer}"):
        return getattr(model, f"mogrifier_{kind}_weight_l{layer}")[j]
    left = getattr(model, f"mogrifier_{kind}_left_l{layer}")[j]
    right = getattr(model, f"mogrifier_{kind}_right_l{layer}")[j]
    return left @ right


def _by_hand(model, x, h, rounds, zigzag):
    """Eq. 1-2 (and the no-zigzag variant of section 4.1) round by round, with explicit indices."""
    sig = torch.sigmoid
    x_orig, h_orig = x, h
    for i in range(1, rounds + 1):
        if i % 2 == 1:  # x^i = 2 sigma(Q^i h^{i-1} + a_i) * x^{i-2}
            j = (i - 1) // 2
            q, a = _dense(model, "q", j), model.mogrifier_q_bias_l0[j]
            source = h if zigzag else h_orig
            x = 2 * sig(source @ q.T + a) * x
        else:  # h^i = 2 sigma(R^i x^{i-1} + b_i) * h^{i-2}
            j = i // 2 - 1
            r, b = _dense(model, "r", j), model.mogrifier_r_bias_l0[j]
            source = x if zigzag else x_orig
            h = 2 * sig(source @ r.T + b) * h
    return x, h


def _randomise_biases(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "mogrifier" in name and name.endswith(("bias_l0", "bias_l1")):
                p.normal_()


@pytest.mark.parametrize("rounds", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("rank", [3, 0])
@pytest.mark.parametrize("zigzag", [True, False])
def test_mogrify_follows_the_papers_equations(rounds, rank, zigzag):
    model = moglm.MogrifierLSTM(7, 5, rounds=rounds, rank=rank, zigzag=zigzag, dtype=D)
    _randomise_biases(model)
    x, h = torch.randn(4, 7, dtype=D), torch.randn(4, 5, dtype=D)
    x_up, h_up = model.mogrify(x, h)
    x_ref, h_ref = _by_hand(model, x, h, rounds, zigzag)
    torch.testing.assert_close(x_up, x_ref)
    torch.testing.assert_close(h_up, h_ref)
    if rounds == 1:
        torch.testing.assert_close(h_up, h)  # only x is gated in round 1


@pytest.mark.parametrize("rounds", [2, 5])
def test_zigzag_and_no_zigzag_differ(rounds):
    a = moglm.MogrifierLSTM(7, 5, rounds=rounds, rank=3, dtype=D)
    b = moglm.MogrifierLSTM(7, 5, rounds=rounds, rank=3, zigzag=False, dtype=D)
    b.load_state_dict(a.state_dict())
    x, h = torch.randn(4, 7, dtype=D), torch.randn(4, 5, dtype=D)
    # round 2 sees x^1 (zigzag) or x (no zigzag)
    assert not torch.allclose(a.mogrify(x, h)[1], b.mogrify(x, h)[1])


def test_mogrifier_step_feeds_mogrified_inputs_to_the_lstm_and_carries_c_unchanged():
    model = moglm.MogrifierLSTM(7, 5, rounds=4, rank=2, dtype=D)
    _randomise_biases(model)
    x, h0, c0 = torch.randn(1, 3, 7, dtype=D), torch.randn(1, 3, 5, dtype=D), torch.randn(1, 3, 5, dtype=D)
    y, (h, c) = model(x, (h0, c0))
    x_up, h_up = _by_hand(model, x[0], h0[0], 4, True)
    lstm = moglm.LSTM(7, 5, dtype=D)
    lstm.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("mogrifier")})
    y_ref, (h_ref, c_ref) = lstm(x_up[None], (h_up[None], c0))
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(c, c_ref)


@pytest.mark.parametrize("num_layers", [1, 2])
def test_rounds_zero_equals_the_lstm(num_layers):
    ref = nn.LSTM(13, 17, num_layers, dtype=D)
    model = moglm.MogrifierLSTM(13, 17, num_layers, rounds=0, dtype=D)
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in ref.named_parameters()]
    model.load_state_dict(ref.state_dict())
    x = torch.randn(6, 3, 13, dtype=D)
    y, (h, c) = model(x)
    y_ref, (h_ref, c_ref) = ref(x)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(h, h_ref)
    torch.testing.assert_close(c, c_ref)


@pytest.mark.parametrize("rank", [4, 0])
def test_zero_round_matrices_make_the_mogrifier_exactly_an_lstm(rank):
    model = moglm.MogrifierLSTM(13, 17, 2, rounds=5, rank=rank, dtype=D)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("mogrifier") and ("left" in name or "weight" in name or "bias" in name):
                p.zero_()
    lstm = moglm.LSTM(13, 17, 2, dtype=D)
    lstm.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("mogrifier")})
    x = torch.randn(6, 3, 13, dtype=D)
    torch.testing.assert_close(model(x)[0], lstm(x)[0])


@pytest.mark.parametrize("rank", [4, 0])
@pytest.mark.parametrize("batch_first", [False, True])
def test_from_lstm_reproduces_the_source_lstm_and_can_learn(rank, batch_first):
    source = nn.LSTM(13, 17, 2, batch_first=batch_first, dtype=D)
    model = moglm.MogrifierLSTM.from_lstm(source, rounds=5, rank=rank)
    assert model.batch_first == batch_first and model.weight_ih_l0.dtype == D
    x = torch.randn(3, 6, 13, dtype=D)
    y, (h, c) = model(x)
    y_ref, (h_ref, c_ref) = source(x)
    assert torch.equal(y, y_ref) or torch.allclose(y, y_ref, rtol=0, atol=1e-14)
    torch.testing.assert_close(h, h_ref, rtol=0, atol=1e-14)
    torch.testing.assert_close(c, c_ref, rtol=0, atol=1e-14)
    y.square().sum().backward()
    for kind in ("q", "r"):
        name = f"mogrifier_{kind}_{'left' if rank else 'weight'}_l1"
        assert getattr(model, name).grad.abs().sum() > 0, f"{name} gets no gradient"


def test_from_lstm_accepts_moglm_lstm_and_rejects_bidirectional():
    src = moglm.LSTM(5, 6, capped_input_gate=True, dtype=D)
    model = moglm.MogrifierLSTM.from_lstm(src, rounds=3, rank=2)
    assert model.cells[0].capped_input_gate
    x = torch.randn(4, 2, 5, dtype=D)
    torch.testing.assert_close(model(x)[0], src(x)[0], rtol=0, atol=1e-14)
    with pytest.raises(ValueError, match="lstm"):
        moglm.MogrifierLSTM.from_lstm(nn.LSTM(5, 6, bidirectional=True))


@pytest.mark.parametrize("rounds", [0, 1, 2, 5, 6])
@pytest.mark.parametrize("rank", [3, 0])
@pytest.mark.parametrize("num_layers", [1, 2])
def test_parameter_count_matches_the_formula(rounds, rank, num_layers):
    m, n = 11, 9
    model = moglm.MogrifierLSTM(m, n, num_layers, rounds=rounds, rank=rank)
    expected = 0
    for layer in range(num_layers):
        inp = m if layer == 0 else n
        lstm = 4 * n * (inp + n) + 2 * 4 * n  # W_ih, W_hh, b_ih, b_hh (torch.nn.LSTM's layout)
        nq, nr = math.ceil(rounds / 2), rounds // 2
        if rank > 0:
            q, r = rank * (inp + n) + inp, rank * (n + inp) + n
        else:
            q, r = inp * n + inp, n * inp + n
        expected += lstm + nq * q + nr * r
    assert sum(p.numel() for p in model.parameters()) == expected


def test_round_matrices_are_dense_in_round_order_with_the_documented_shapes():
    model = moglm.MogrifierLSTM(7, 5, 2, rounds=5, rank=3, dtype=D)
    mats = model.round_matrices(layer=0)
    assert [tuple(m.shape) for m in mats] == [(7, 5), (5, 7), (7, 5), (5, 7), (7, 5)]
    torch.testing.assert_close(mats[2], model.mogrifier_q_left_l0[1] @ model.mogrifier_q_right_l0[1])
    torch.testing.assert_close(mats[3], model.mogrifier_r_left_l0[1] @ model.mogrifier_r_right_l0[1])
    assert [tuple(m.shape) for m in model.round_matrices(layer=1)] == [(5, 5)] * 5
    assert torch.linalg.matrix_rank(mats[0]).item() == 3
    full = moglm.MogrifierLSTM(7, 5, rounds=2, rank=0)
    assert full.round_matrices()[1] is not None and torch.linalg.matrix_rank(full.round_matrices()[1]).item() == 5


def test_factor_init_gives_products_of_variance_one_over_fan_in():
    model = moglm.MogrifierLSTM(600, 500, rounds=2, rank=40)
    q, r = model.round_matrices()
    # truncation at 2 std shrinks each factor's variance by ~0.774, the product's by ~0.774**2
    assert abs(q.var().item() * 500 / 0.774**2 - 1) < 0.1
    assert abs(r.var().item() * 600 / 0.774**2 - 1) < 0.1
    assert model.mogrifier_q_bias_l0.abs().max().item() == 0.0
