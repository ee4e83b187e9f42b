"""Dyck-RNN (report section 4.2): the shifts equal the explicit W1 / W2, the step follows eq. 3-5, and a saturated
gate makes h an exact stack of the open brackets."""

from __future__ import annotations

import pytest
import torch

import moglm
from moglm.cells.dyck_rnn import bracket_embedding_table, shift_down, shift_matrices, shift_up

D = torch.float64


@pytest.mark.parametrize("hidden", [1, 2, 5])
def test_shifts_equal_the_explicit_sub_and_superdiagonal_matrices(hidden):
    w1, w2 = shift_matrices(hidden, dtype=D)
    for i in range(hidden):
        for j in range(hidden):
            assert w1[i, j] == (1.0 if i == j + 1 else 0.0)  # subdiagonal
            assert w2[i, j] == (1.0 if j == i + 1 else 0.0)  # superdiagonal
    h = torch.randn(3, hidden, dtype=D)
    assert torch.equal(shift_down(h), h @ w1.T)
    assert torch.equal(shift_up(h), h @ w2.T)


@pytest.mark.parametrize("bias", [True, False])
def test_dyck_rnn_step_follows_eq_3_to_5_with_explicit_matrices(bias):
    model = moglm.DyckRNN(3, 6, bias=bias, dtype=D)
    if bias:
        with torch.no_grad():
            model.bias_ih_l0.normal_()
            model.bias_gate_l0.normal_()
    x, h0 = torch.randn(5, 4, 3, dtype=D), torch.randn(1, 4, 6, dtype=D)
    y, h_n = model(x, h0)
    w1, w2 = shift_matrices(6, dtype=D)
    h, outs = h0[0], []
    for x_t in x:
        g = torch.sigmoid(x_t @ model.weight_gate_l0.T + (model.bias_gate_l0 if bias else 0))  # eq. 3, [B, 1]
        w_hh = g[:, :, None] * w1 + (1 - g[:, :, None]) * w2  # eq. 4, [B, H, H]
        h = torch.einsum("bij,bj->bi", w_hh, h) + g * (x_t @ model.weight_ih_l0.T + (model.bias_ih_l0 if bias else 0))
        outs.append(h)  # eq. 5, no nonlinearity
    torch.testing.assert_close(y, torch.stack(outs))
    torch.testing.assert_close(h_n[0], h)


def test_saturated_gate_makes_h_a_stack_of_open_brackets():
    """Hand-set weights: push the bracket's embedding on '(' / '[' and pop on ')' / ']'; h[0] is the top."""
    depth = 4
    model = moglm.DyckRNN(1, depth, dtype=D)
    with torch.no_grad():
        model.weight_gate_l0.fill_(40.0)  # g ~ 1 for open (+1, +2), ~ 0 for close (-1, -2)
        model.bias_gate_l0.zero_()
        model.weight_ih_l0.zero_()
        model.weight_ih_l0[0] = 1.0  # write the embedding on top of the stack
        model.bias_ih_l0.zero_()
    embedding = moglm.DyckRNN.bracket_embedding(2, dtype=D)
    tokens = "([([]])[()]"
    ids = torch.tensor(["([)]".index(t) for t in tokens])
    y, _ = model(embedding(ids)[:, None])  # [T, 1, depth]
    stack: list[float] = []
    for t, token in enumerate(tokens):
        if token in "([":
            stack.insert(0, float("([".index(token) + 1))
        else:
            stack.pop(0)
        expected = torch.tensor((stack + [0.0] * depth)[:depth], dtype=D)
        torch.testing.assert_close(y[t, 0], expected, rtol=0, atol=1e-12)


def test_bracket_embeddings_fixed_and_learned():
    table = bracket_embedding_table(3)
    assert table.squeeze(1).tolist() == [1.0, 2.0, 3.0, -1.0, -2.0, -3.0]
    fixed = moglm.DyckRNN.bracket_embedding(3)
    assert fixed.weight.shape == (6, 1) and not fixed.weight.requires_grad
    learned = moglm.DyckRNN.bracket_embedding(3, learned=True)
    assert learned.weight.shape == (6, 2) and learned.weight.requires_grad
    model = moglm.DyckRNN(2, 2 * 4)  # the report's variant for depth 4: 2-d learned embedding, 2m units
    y, h = model(learned(torch.tensor([[0, 1, 4, 3]])), None)
    assert y.shape == (1, 4, 8) and h.shape == (1, 4, 8)
    with pytest.raises(ValueError, match="num_types"):
        bracket_embedding_table(0)


def test_parameters_are_only_the_trainable_ones_and_paper_init_starts_at_the_reports_equations():
    model = moglm.DyckRNN(3, 8, init="paper")
    assert dict((n, tuple(p.shape)) for n, p in model.named_parameters()) == {
        "weight_ih_l0": (8, 3), "weight_gate_l0": (1, 3), "bias_ih_l0": (8,), "bias_gate_l0": (1,)
    }
    assert not list(model.buffers())
    assert model.bias_ih_l0.abs().max().item() == 0.0 and model.bias_gate_l0.item() == 0.0
    # the report's equations for m = 4: W_ih [4, 1] + W_gate [1, 1]
    assert sum(p.numel() for p in moglm.DyckRNN(1, 4, bias=False).parameters()) == 5
    assert all(p.abs().max().item() <= 1 / 25**0.5 for p in moglm.DyckRNN(10, 25, init="torch").parameters())
