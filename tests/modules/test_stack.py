"""The nn.LSTM-style stack: streaming, state dropout, argument checks and the torch.nn conventions."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn

import moglm

D = torch.float64

MODULES = {
    "lstm": lambda **kw: moglm.LSTM(5, 7, 2, **kw),
    "mogrifier": lambda **kw: moglm.MogrifierLSTM(5, 7, 2, rounds=5, rank=3, **kw),
    "mogrifier_full_no_zigzag": lambda **kw: moglm.MogrifierLSTM(5, 7, 2, rounds=4, rank=0, zigzag=False, **kw),
    "multiplicative_lstm": lambda **kw: moglm.MultiplicativeLSTM(5, 7, 2, **kw),
}


@pytest.mark.parametrize("name", sorted(MODULES))
@pytest.mark.parametrize("batch_first", [False, True])
def test_forward_of_concatenation_equals_forward_then_forward_from_state(name, batch_first):
    model = MODULES[name](batch_first=batch_first, dtype=D)
    dim = 1 if batch_first else 0
    x = torch.randn((3, 9, 5) if batch_first else (9, 3, 5), dtype=D)
    a, b = x.split([4, 5], dim=dim)
    y_all, state_all = model(x)
    y_a, state_a = model(a)
    y_b, state_b = model(b, state_a)
    torch.testing.assert_close(torch.cat([y_a, y_b], dim=dim), y_all)
    for s, t in zip(state_b, state_all):
        torch.testing.assert_close(s, t)


def test_multiplicative_lstm_step_follows_krause_equations():
    model = moglm.MultiplicativeLSTM(5, 7, dtype=D)
    x, h0, c0 = torch.randn(1, 3, 5, dtype=D), torch.randn(1, 3, 7, dtype=D), torch.randn(1, 3, 7, dtype=D)
    _, (h, c) = model(x, (h0, c0))
    m = (x[0] @ model.weight_mx_l0.T) * (h0[0] @ model.weight_mh_l0.T)  # eq. 3.5
    g = x[0] @ model.weight_ih_l0.T + m @ model.weight_hh_l0.T + model.bias_ih_l0 + model.bias_hh_l0
    i, f, j, o = g[:, :7].sigmoid(), g[:, 7:14].sigmoid(), g[:, 14:21].tanh(), g[:, 21:].sigmoid()
    c_ref = f * c0[0] + i * j
    torch.testing.assert_close(c[0], c_ref)
    torch.testing.assert_close(h[0], o * c_ref.tanh())
    assert sum(p.numel() for p in model.parameters()) == 4 * 7 * (5 + 7) + 8 * 7 + 7 * 5 + 7 * 7


@pytest.mark.parametrize("name", sorted(MODULES))
def test_state_dropout_uses_one_mask_per_sequence_shared_over_time_independent_per_layer(name):
    p = 0.5
    model = MODULES[name](state_dropout=p, dtype=D).train()
    seen_in = {k: [] for k in range(model.num_layers)}  # h_prev as each step received it
    seen_out = {k: [] for k in range(model.num_layers)}  # h each step produced
    for k, cell in enumerate(model.cells):
        original = cell.step

        def recording(params, x, state, k=k, original=original):
            seen_in[k].append(state[0])
            h, new_state = original(params, x, state)
            seen_out[k].append(h)
            return h, new_state

        cell.step = recording

    def masks_per_step(h0):
        """mask_t = (h_prev received at step t) / (true previous output), for every layer and step."""
        out = {}
        for k in range(model.num_layers):
            previous = [h0[k]] + seen_out[k][:-1]
            out[k] = [received / prev for received, prev in zip(seen_in[k], previous)]
        return out

    h0 = torch.rand(2, 3, 7, dtype=D) + 0.5
    model(torch.randn(6, 3, 5, dtype=D), (h0, torch.randn(2, 3, 7, dtype=D)))
    masks = masks_per_step(h0)
    for k in range(model.num_layers):
        first = masks[k][0]
        assert set(torch.unique(first).tolist()) <= {0.0, 1 / (1 - p)}
        assert 0 < (first == 0).double().mean() < 1
        for t, mask in enumerate(masks[k][1:], start=1):
            torch.testing.assert_close(mask, first, msg=f"layer {k} step {t} used a different mask")
    assert not torch.equal(masks[0][0], masks[1][0]), "layers must draw independent masks"
    for k in range(model.num_layers):
        seen_in[k].clear()
        seen_out[k].clear()
    model(torch.randn(6, 3, 5, dtype=D), (h0, torch.randn(2, 3, 7, dtype=D)))
    assert not torch.equal(masks_per_step(h0)[0][0], masks[0][0]), "a new sequence draws a new mask"
    model.eval()
    for k in range(model.num_layers):
        seen_in[k].clear()
        seen_out[k].clear()
    model(torch.randn(6, 3, 5, dtype=D), (h0, torch.randn(2, 3, 7, dtype=D)))
    assert all(torch.allclose(m, torch.ones_like(m)) for m in masks_per_step(h0)[0]), "no dropout in eval"


@pytest.mark.parametrize(
    "make, argument",
    [
        (lambda: moglm.MogrifierLSTM(5, 7, rounds=-1), "rounds"),
        (lambda: moglm.MogrifierLSTM(5, 7, rounds=2, rank=6), "rank"),
        (lambda: moglm.MogrifierLSTM(5, 7, rounds=2, rank=2.5), "rank"),
        (lambda: moglm.LSTM(5, 7, num_layers=0), "num_layers"),
        (lambda: moglm.LSTM(0, 7), "input_size"),
        (lambda: moglm.LSTM(5, 0), "hidden_size"),
        (lambda: moglm.LSTM(5, 7, dropout=1.0), "dropout"),
        (lambda: moglm.LSTM(5, 7, state_dropout=-0.1), "state_dropout"),
        (lambda: moglm.LSTM(5, 7, init="xavier"), "init"),
        (lambda: moglm.LSTM(5, 7, backend="cuda-magic"), "backend"),
    ],
)
def test_bad_constructor_arguments_raise_value_error_naming_the_argument(make, argument):
    with pytest.raises(ValueError, match=argument):
        make()


@pytest.mark.parametrize("name", sorted(MODULES))
def test_bad_forward_arguments_raise_value_error_naming_the_argument(name):
    model = MODULES[name]()
    x = torch.randn(4, 3, 5)
    h, c = torch.zeros(2, 3, 7), torch.zeros(2, 3, 7)
    cases = [
        (torch.randn(4, 3, 5, 1), (h, c), "input"),  # wrong rank
        (torch.randn(5), (h, c), "input"),
        (torch.randn(4, 3, 6), (h, c), "input"),  # wrong size
        (torch.randn(0, 3, 5), (h, c), "input"),  # no time steps
        (x.double(), (h, c), "input"),  # wrong dtype
        (x, (torch.zeros(2, 4, 7), c), r"hx\[0\]"),  # wrong batch
        (x, (h, torch.zeros(1, 3, 7)), r"hx\[1\]"),  # wrong layers
        (x, (h, c.double()), r"hx\[1\]"),
        (x, (h,), "hx"),  # missing c
        (x, h, "hx"),
        (x[:, 0], (h, c), r"hx\[0\]"),  # unbatched input, batched state
    ]
    for inp, hx, argument in cases:
        with pytest.raises(ValueError, match=argument):
            model(inp, hx)


def test_mogrify_and_round_matrices_check_their_arguments():
    model = moglm.MogrifierLSTM(5, 7, 2, rounds=2, rank=3)
    with pytest.raises(ValueError, match="layer"):
        model.round_matrices(layer=2)
    with pytest.raises(ValueError, match="x"):
        model.mogrify(torch.randn(2, 7), torch.randn(2, 7), layer=0)
    with pytest.raises(ValueError, match="h"):
        model.mogrify(torch.randn(2, 5), torch.randn(2, 5), layer=0)
    x_up, h_up = model.mogrify(torch.randn(2, 7), torch.randn(2, 7), layer=1)
    assert x_up.shape == (2, 7) and h_up.shape == (2, 7)


def test_inter_layer_dropout_acts_between_layers_only_in_training():
    model = moglm.MogrifierLSTM(5, 7, 2, rounds=3, rank=2, dropout=0.5, dtype=D)
    x = torch.randn(6, 3, 5, dtype=D)
    model.eval()
    y_eval, _ = model(x)
    torch.testing.assert_close(model(x)[0], y_eval)  # deterministic in eval
    model.train()
    torch.manual_seed(1)
    y1, _ = model(x)
    torch.manual_seed(2)
    y2, _ = model(x)
    assert not torch.allclose(y1, y2)
    single = moglm.MogrifierLSTM(5, 7, 1, rounds=3, rank=2, dropout=0.5, dtype=D).train()
    torch.testing.assert_close(single(x)[0], single(x)[0])  # one layer: nothing to drop between


@pytest.mark.parametrize("name", sorted(MODULES))
def test_dtype_moves_and_state_dict_round_trip(name):
    model = MODULES[name]()
    x = torch.randn(4, 3, 5)
    model64 = copy.deepcopy(model).to(torch.float64)
    assert all(p.dtype == torch.float64 for p in model64.parameters())
    torch.testing.assert_close(model64(x.double())[0].float(), model(x)[0], rtol=1e-4, atol=1e-5)
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    fresh = MODULES[name]()
    fresh.load_state_dict(torch.load(buffer, weights_only=True))
    torch.testing.assert_close(fresh(x)[0], model(x)[0], rtol=0, atol=0)
    if torch.cuda.is_available():  # pragma: no cover - exercised on GPU machines
        cuda = copy.deepcopy(model).cuda()
        torch.testing.assert_close(cuda(x.cuda())[0].cpu(), model(x)[0], rtol=1e-4, atol=1e-5)


def test_repr_shows_the_configuration():
    assert repr(moglm.MogrifierLSTM(13, 17, 2, rounds=5, rank=4, dropout=0.1)) == (
        "MogrifierLSTM(13, 17, num_layers=2, rank=4, dropout=0.1)"
    )  # options are shown where they differ from their default, as torch.nn.LSTM's arguments
    assert repr(moglm.MogrifierLSTM(13, 17, rounds=6, rank=0, zigzag=False, batch_first=True)) == (
        "MogrifierLSTM(13, 17, rounds=6, rank=0, zigzag=False, batch_first=True)"
    )
    assert repr(moglm.LSTM(3, 4, capped_input_gate=True, bias=False)) == (
        "LSTM(3, 4, capped_input_gate=True, bias=False)"
    )
    assert repr(moglm.MultiplicativeLSTM(3, 4, state_dropout=0.25)) == "MultiplicativeLSTM(3, 4, state_dropout=0.25)"
    assert repr(moglm.LSTM(3, 4, init="paper")) == "LSTM(3, 4, init=paper)"


def test_parameters_are_registered_as_in_torch_lstm_and_state_is_not_stored():
    model = moglm.MogrifierLSTM(5, 7, 2, rounds=2, rank=3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model(torch.randn(4, 3, 5))
    assert set(model.state_dict()) == set(before)  # no hidden state appeared on the module
    assert not list(model.buffers())
    assert isinstance(model.weight_hh_l1, nn.Parameter)


def test_torch_export_of_forward_matches_eager():
    model = moglm.MogrifierLSTM(5, 7, 2, rounds=3, rank=2).eval()
    x = torch.randn(4, 3, 5)
    state = (torch.randn(2, 3, 7), torch.randn(2, 3, 7))
    exported = torch.export.export(model, (x, state))
    y, (h, c) = exported.module()(x, state)
    y_ref, (h_ref, c_ref) = model(x, state)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(c, c_ref)


@pytest.mark.slow
def test_torch_compile_of_forward_and_backward_matches_eager():
    model = moglm.MogrifierLSTM(5, 7, 2, rounds=3, rank=2)
    compiled = torch.compile(model)
    x = torch.randn(3, 2, 5)
    y, _ = compiled(x)
    y.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    y_ref, _ = model(x)
    y_ref.sum().backward()
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-6)
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-5, atol=1e-6)


def test_layer_parameters_are_the_registered_ones_after_a_parameter_a_cell_or_a_parametrization_changes():
    """The names are kept per layer and cell (a one-token step asks at every step); what they name is read anew:
    a replaced parameter, a replaced cell, a deep copy's own parameters and a parametrized weight all show."""
    from torch.nn.utils import parametrize

    from moglm.dynamic_evaluation.sparse import AdaptedCell

    model = moglm.MogrifierLSTM(5, 4, 2, rounds=3, rank=2)
    first = model.layer_parameters(1)
    assert all(first[name] is getattr(model, f"{name}_l1") for name in model.cells[1].parameter_shapes())
    model.weight_hh_l1 = nn.Parameter(torch.zeros(16, 4))
    assert model.layer_parameters(1)["weight_hh"] is model.weight_hh_l1
    copied = copy.deepcopy(model)
    assert copied.layer_parameters(0)["weight_ih"] is copied.weight_ih_l0
    assert copied.layer_parameters(0)["weight_ih"] is not model.weight_ih_l0
    model.cells[0] = AdaptedCell(model.cells[0], torch.zeros(2, 2))
    assert set(model.layer_parameters(0)) == set(model.cells[0].parameter_shapes())

    class Doubled(nn.Module):
        def forward(self, w):
            return 2 * w

    parametrize.register_parametrization(model, "weight_ih_l1", Doubled())
    assert torch.equal(model.layer_parameters(1)["weight_ih"], 2 * model.parametrizations.weight_ih_l1.original)
