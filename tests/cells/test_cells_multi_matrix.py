"""mmRNN and mmLSTM follow the report's eq. 6-22: the one-GEMM implementation equals explicit per-example
[B, H, H] transition matrices, the key is carried in the state and starts uniform, and K = 1 is the RNN / LSTM."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import moglm

D = torch.float64
GATES = 4


def _randomise_key_bias(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("bias"):
                p.normal_()


def _explicit_pre_activations(model, x, h, key, gates, k, layer=0):
    """Per gate g: key_g = softmax(W_proj^g [key_g; h; x] + b), W_g(t) = sum_j key_g[j] W_g[j] as a [B, H, H]
    tensor, pre_g = W_g(t) h + W_hx^g x + biases. Returns ([B, G, H] pre-activations, [B, G, K] keys)."""
    names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_key", "bias_key")
    p = {n: getattr(model, f"{n}_l{layer}") for n in names}
    hidden = h.shape[-1]
    mats = p["weight_hh"].view(k, gates, hidden, hidden)  # [K, G, H, H]: block j is the j-th recurrent matrix
    pres, keys = [], []
    for g in range(gates):
        rows = slice(g * k, (g + 1) * k)
        key_g = torch.softmax(torch.cat([key[:, g], h, x], -1) @ p["weight_key"][rows].T + p["bias_key"][rows], -1)
        w_t = torch.einsum("bj,jrc->brc", key_g, mats[:, g])  # [B, H, H], one matrix per example
        units = slice(g * hidden, (g + 1) * hidden)
        pre = torch.bmm(w_t, h.unsqueeze(-1)).squeeze(-1) + x @ p["weight_ih"][units].T
        pres.append(pre + p["bias_ih"][units] + p["bias_hh"][units])
        keys.append(key_g)
    return torch.stack(pres, 1), torch.stack(keys, 1)


@pytest.mark.parametrize("k", [1, 3])
def test_mmrnn_equals_explicit_per_example_transition_matrices(k):
    model = moglm.MultiMatrixRNN(5, 7, num_matrices=k, dtype=D)
    _randomise_key_bias(model)
    x, h0 = torch.randn(4, 3, 5, dtype=D), torch.randn(1, 3, 7, dtype=D)
    key0 = torch.softmax(torch.randn(1, 3, k, dtype=D), -1)
    y, (h_n, key_n) = model(x, (h0, key0))
    h, key, outs = h0[0], key0[0][:, None], []
    for x_t in x:
        pre, key = _explicit_pre_activations(model, x_t, h, key, 1, k)
        h = torch.tanh(pre[:, 0])  # eq. 8
        outs.append(h)
    torch.testing.assert_close(y, torch.stack(outs))
    torch.testing.assert_close(h_n[0], h)
    torch.testing.assert_close(key_n[0], key[:, 0])


@pytest.mark.parametrize("capped", [False, True])
def test_mmlstm_equals_explicit_per_example_transition_matrices(capped):
    k = 3
    model = moglm.MultiMatrixLSTM(5, 7, num_matrices=k, capped_input_gate=capped, dtype=D)
    _randomise_key_bias(model)
    x, h0, c0 = torch.randn(4, 3, 5, dtype=D), torch.randn(1, 3, 7, dtype=D), torch.randn(1, 3, 7, dtype=D)
    key0 = torch.softmax(torch.randn(1, 3, GATES, k, dtype=D), -1).flatten(2)  # [1, B, 4K]
    y, (h_n, c_n, key_n) = model(x, (h0, c0, key0))
    h, c, key, outs = h0[0], c0[0], key0[0].view(3, GATES, k), []
    for x_t in x:
        pre, key = _explicit_pre_activations(model, x_t, h, key, GATES, k)
        i, f, j, o = pre[:, 0].sigmoid(), pre[:, 1].sigmoid(), pre[:, 2].tanh(), pre[:, 3].sigmoid()  # eq. 17-20
        c = f * c + (torch.minimum(1 - f, i) if capped else i) * j  # eq. 21
        h = o * torch.tanh(c)  # eq. 22
        outs.append(h)
    torch.testing.assert_close(y, torch.stack(outs))
    torch.testing.assert_close(c_n[0], c)
    torch.testing.assert_close(key_n[0], key.flatten(1))


@pytest.mark.parametrize("make, key_size", [(moglm.MultiMatrixRNN, 4), (moglm.MultiMatrixLSTM, 16)])
def test_zero_key_state_is_the_uniform_key_and_keys_stay_distributions(make, key_size):
    model = make(5, 7, 2, num_matrices=4, dtype=D)
    _randomise_key_bias(model)
    x = torch.randn(6, 3, 5, dtype=D)
    others = (torch.zeros(2, 3, 7, dtype=D),) * (len(model.state_names) - 1)
    y_none, state = model(x)
    y_zero, _ = model(x, (*others, torch.zeros(2, 3, key_size, dtype=D)))
    y_uniform, _ = model(x, (*others, torch.full((2, 3, key_size), 0.25, dtype=D)))
    torch.testing.assert_close(y_none, y_uniform)
    torch.testing.assert_close(y_zero, y_uniform)
    key = state[-1].view(2, 3, -1, 4)  # [L, B, G, K]
    assert (key > 0).all()
    torch.testing.assert_close(key.sum(-1), torch.ones(key.shape[:-1], dtype=D))
    # a row reset to zero (as a training loop does) reads as uniform; the other rows keep their key
    reset = state[-1].clone()
    reset[:, 1] = 0
    y_reset, _ = model(x, (*state[:-1], reset))
    y_ref, _ = model(x, (*state[:-1], torch.where(reset == 0, 0.25, reset)))
    torch.testing.assert_close(y_reset, y_ref)
    y_all_uniform, _ = model(x, (*state[:-1], torch.full_like(reset, 0.25)))
    assert not torch.allclose(y_reset[:, 0], y_all_uniform[:, 0])


@pytest.mark.parametrize("num_layers", [1, 2])
def test_one_matrix_is_exactly_the_rnn_and_the_lstm(num_layers):
    x = torch.randn(5, 3, 13, dtype=D)
    h0, c0 = torch.randn(num_layers, 3, 17, dtype=D), torch.randn(num_layers, 3, 17, dtype=D)
    for ours, ref, hx in (
        (moglm.MultiMatrixRNN(13, 17, num_layers, num_matrices=1, dtype=D), nn.RNN(13, 17, num_layers, dtype=D), h0),
        (
            moglm.MultiMatrixLSTM(13, 17, num_layers, num_matrices=1, dtype=D),
            nn.LSTM(13, 17, num_layers, dtype=D),
            (h0, c0),
        ),
    ):
        ours.load_state_dict(ref.state_dict(), strict=False)  # the key parameters stay (K = 1: the key is always 1)
        key = torch.zeros(num_layers, 3, 1 if isinstance(hx, torch.Tensor) else GATES, dtype=D)
        state = (hx, key) if isinstance(hx, torch.Tensor) else (*hx, key)
        y, final = ours(x, state)
        y_ref, final_ref = ref(x, hx)
        torch.testing.assert_close(y, y_ref)
        for got, expected in zip(final, final_ref if isinstance(final_ref, tuple) else (final_ref,)):
            torch.testing.assert_close(got, expected)
        torch.testing.assert_close(final[-1], torch.ones_like(final[-1]))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("k", [1, 4])
def test_parameter_counts_and_shapes(bias, k):
    m, n = 11, 9
    count = 0
    for inp in (m, n):
        count += n * inp + k * n * n + bias * 2 * n + k * (k + n + inp) + bias * k
    model = moglm.MultiMatrixRNN(m, n, 2, num_matrices=k, bias=bias)
    assert sum(p.numel() for p in model.parameters()) == count
    assert model.weight_hh_l1.shape == (k * n, n) and model.weight_key_l0.shape == (k, k + n + m)
    count = 0
    for inp in (m, n):
        count += 4 * n * inp + 4 * k * n * n + bias * 8 * n + 4 * k * (k + n + inp) + bias * 4 * k
    model = moglm.MultiMatrixLSTM(m, n, 2, num_matrices=k, bias=bias)
    assert sum(p.numel() for p in model.parameters()) == count
    assert model.weight_hh_l0.shape == (4 * k * n, n) and model.weight_key_l1.shape == (4 * k, k + n + n)


def test_paper_init_scales_and_zero_key_bias():
    model = moglm.MultiMatrixLSTM(400, 300, num_matrices=2, init="paper")
    assert model.bias_key_l0.abs().max().item() == 0.0
    assert abs(model.weight_key_l0.std().item() / (1 / 702) ** 0.5 - 0.88) < 0.05
    assert abs(model.weight_hh_l0.std().item() / (1 / 300) ** 0.5 - 0.88) < 0.03
    assert abs(model.bias_ih_l0[300:600].mean().item() - 1.0) < 0.02  # forget bias as in the LSTM
    for model in (moglm.MultiMatrixRNN(10, 25, init="torch"), moglm.MultiMatrixLSTM(10, 25, init="torch")):
        assert all(p.abs().max().item() <= 1 / 25**0.5 for p in model.parameters())

