"""PackedSequence input, as torch.nn.LSTM takes it: a packed batch computes what each sequence computes
alone (outputs, final states at each sequence's own length, every gradient), and moglm.LSTM's packed
results equal torch.nn.LSTM's."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

import moglm
from moglm.modules import ARCHITECTURES

D = torch.float64
M, H, L = 5, 7, 2
LENGTHS = [4, 7, 2, 4, 1]  # unsorted, with a tie

OPTIONS = {"mogrifier": {"rounds": 3, "rank": 2}, "mogrifier_gru": {"rounds": 3}, "mogrifier_rnn": {"rounds": 2}}
FAST = ["lstm", "mogrifier", "multiplicative_lstm"]  # the architectures with a fused and a compiled window


def _tuple(state):
    return (state,) if isinstance(state, torch.Tensor) else tuple(state)


def _random_state(model, batch):
    return tuple(torch.randn(L, batch, n, dtype=D) for n in model.cells[-1].state_sizes())


def _leaves(model, x, hx):
    return [x, *hx, *model.parameters()]


def _grads(tensors):
    grads = [t.grad.clone() for t in tensors]
    for t in tensors:
        t.grad = None
    return grads


def _weights(lengths, size):
    """Loss weights: padded ``[T, B, size]`` for the outputs (zero past each length), ``[L, B, n]`` for states."""
    out = torch.randn(max(lengths), len(lengths), size, dtype=D)
    for i, n in enumerate(lengths):
        out[n:, i] = 0
    return out


@pytest.mark.parametrize("enforce_sorted", [False, True])
@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_packed_batch_equals_each_sequence_alone(name, enforce_sorted):
    backends = ["reference", "fused", "auto"] if name in FAST else ["auto"]
    lengths = sorted(LENGTHS, reverse=True) if enforce_sorted else LENGTHS
    batch = len(lengths)
    for backend in backends:
        torch.manual_seed(0)
        model = ARCHITECTURES[name](M, H, L, backend=backend, dtype=D, **OPTIONS.get(name, {})).eval()
        x = torch.randn(max(lengths), batch, M, dtype=D, requires_grad=True)  # [T, B, m], padded
        hx = tuple(s.requires_grad_() for s in _random_state(model, batch))
        w_out = _weights(lengths, H)
        w_state = [torch.randn_like(s) for s in hx]
        leaves = _leaves(model, x, hx)

        packed = pack_padded_sequence(x, torch.tensor(lengths), enforce_sorted=enforce_sorted)
        out, state = model(packed, hx[0] if len(hx) == 1 else hx)
        assert isinstance(out, PackedSequence) and torch.equal(out.batch_sizes, packed.batch_sizes)
        y, out_lengths = pad_packed_sequence(out)  # [T, B, H], caller's order
        assert out_lengths.tolist() == lengths
        loss = (y * w_out).sum() + sum((s * w).sum() for s, w in zip(_tuple(state), w_state))
        loss.backward()
        grads = _grads(leaves)

        alone_loss = 0
        for i, n in enumerate(lengths):
            hx_i = tuple(s[:, i : i + 1] for s in hx)
            y_i, state_i = model(x[:n, i : i + 1], hx_i[0] if len(hx_i) == 1 else hx_i)  # [n, 1, H]
            torch.testing.assert_close(y[:n, i], y_i[:, 0], msg=f"{backend}: outputs of sequence {i}")
            assert not y[n:, i].any(), "outputs past a sequence's end are zero"
            for s, t in zip(_tuple(state), _tuple(state_i)):
                torch.testing.assert_close(s[:, i], t[:, 0], msg=f"{backend}: final state of sequence {i}")
            alone_loss = alone_loss + (y_i[:, 0] * w_out[:n, i]).sum()
            alone_loss = alone_loss + sum((t[:, 0] * w[:, i]).sum() for t, w in zip(_tuple(state_i), w_state))
        alone_loss.backward()
        for g, g_alone in zip(grads, _grads(leaves)):
            torch.testing.assert_close(g, g_alone, msg=f"{backend}: gradients")


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("enforce_sorted", [False, True])
def test_lstm_on_packed_input_equals_torch_lstm(enforce_sorted, batch_first):
    lengths = sorted(LENGTHS, reverse=True) if enforce_sorted else LENGTHS
    ref = nn.LSTM(M, H, L, batch_first=batch_first, dtype=D)
    ours = moglm.LSTM(M, H, L, batch_first=batch_first, dtype=D)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(len(lengths), max(lengths), M, dtype=D)  # [B, T, m]
    h0, c0 = torch.randn(L, len(lengths), H, dtype=D), torch.randn(L, len(lengths), H, dtype=D)
    results = []
    for model in (ref, ours):
        xi, hi, ci = (t.clone().requires_grad_() for t in (x, h0, c0))
        packed = pack_padded_sequence(xi if batch_first else xi.transpose(0, 1), torch.tensor(lengths),
                                      batch_first=batch_first, enforce_sorted=enforce_sorted)
        out, (h, c) = model(packed, (hi, ci))
        loss = (out.data * torch.linspace(-1, 1, out.data.numel(), dtype=D).view_as(out.data)).sum()
        (loss + (h**2).sum() + (c**3).sum()).backward()
        results.append([out.data, h, c, xi.grad, hi.grad, ci.grad, *(p.grad for p in model.parameters())])
        assert torch.equal(out.batch_sizes, packed.batch_sizes)
        if not enforce_sorted:
            assert torch.equal(out.sorted_indices, packed.sorted_indices)
            assert torch.equal(out.unsorted_indices, packed.unsorted_indices)
    for ours_t, ref_t in zip(results[1], results[0]):
        torch.testing.assert_close(ours_t, ref_t)


def test_packed_input_without_state_uses_zeros_and_training_runs():
    model = moglm.MogrifierLSTM(M, H, L, rounds=3, dropout=0.3, state_dropout=0.3, dtype=D)
    packed = pack_padded_sequence(torch.randn(7, 5, M, dtype=D), torch.tensor(LENGTHS), enforce_sorted=False)
    zeros = tuple(torch.zeros(L, 5, H, dtype=D) for _ in range(2))
    model.eval()
    out, state = model(packed)
    out_zero, state_zero = model(packed, zeros)
    torch.testing.assert_close(out.data, out_zero.data)
    for s, t in zip(state, state_zero):
        torch.testing.assert_close(s, t)
    model.train()
    out, (h, c) = model(packed)
    (out.data.sum() + h.sum()).backward()
    assert all(p.grad is not None for p in model.parameters())
    outputs, _ = model.forward_layers(packed)
    assert len(outputs) == L and all(isinstance(o, PackedSequence) for o in outputs)


def test_packed_input_with_the_wrong_feature_size_or_state_is_refused():
    model = moglm.LSTM(M, H, L)
    packed = pack_padded_sequence(torch.randn(7, 5, M + 1), torch.tensor(LENGTHS), enforce_sorted=False)
    with pytest.raises(ValueError, match="input"):
        model(packed)
    packed = pack_padded_sequence(torch.randn(7, 5, M), torch.tensor(LENGTHS), enforce_sorted=False)
    with pytest.raises(ValueError, match=r"hx\[0\]"):
        model(packed, (torch.zeros(L, 4, H), torch.zeros(L, 4, H)))
