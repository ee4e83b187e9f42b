"""The other architectures behind the nn.LSTM-style stack: state carry, registry, argument checks, dropout,
dtype moves and state-dict round trips, torch.export."""

from __future__ import annotations

import copy
import io

import pytest
import torch

import moglm
from moglm.modules import ARCHITECTURES

D = torch.float64

MODULES = {
    "rnn": lambda **kw: moglm.RNN(5, 7, 2, **kw),
    "rnn_relu": lambda **kw: moglm.RNN(5, 7, 2, nonlinearity="relu", **kw),
    "multiplicative_rnn": lambda **kw: moglm.MultiplicativeRNN(5, 7, 2, **kw),
    "mmrnn": lambda **kw: moglm.MultiMatrixRNN(5, 7, 2, num_matrices=3, **kw),
    "mmlstm": lambda **kw: moglm.MultiMatrixLSTM(5, 7, 2, num_matrices=3, **kw),
    "dyck_rnn": lambda **kw: moglm.DyckRNN(5, 7, 2, **kw),
    "gru": lambda **kw: moglm.GRU(5, 7, 2, **kw),
    "mogrifier_gru": lambda **kw: moglm.MogrifierGRU(5, 7, 2, rounds=5, rank=3, **kw),
    "mogrifier_rnn": lambda **kw: moglm.MogrifierRNN(5, 7, 2, rounds=4, rank=0, zigzag=False, **kw),
}

STATE_SIZES = {"mmrnn": (7, 3), "mmlstm": (7, 7, 12)}  # the others: (7,)


def _state(name, batch=3, layers=2):
    sizes = STATE_SIZES.get(name, (7,))
    tensors = tuple(torch.randn(layers, batch, n, dtype=D) for n in sizes)
    return tensors[0] if len(tensors) == 1 else tensors


def _tuple(state):
    return (state,) if isinstance(state, torch.Tensor) else state


@pytest.mark.parametrize("name", sorted(MODULES))
@pytest.mark.parametrize("batch_first", [False, True])
def test_forward_of_concatenation_equals_forward_then_forward_from_state(name, batch_first):
    model = MODULES[name](batch_first=batch_first, dtype=D)
    dim = 1 if batch_first else 0
    x = torch.randn((3, 9, 5) if batch_first else (9, 3, 5), dtype=D)
    a, b = x.split([4, 5], dim=dim)
    for hx in (None, _state(name)):
        y_all, state_all = model(x, hx)
        y_a, state_a = model(a, hx)
        y_b, state_b = model(b, state_a)
        torch.testing.assert_close(torch.cat([y_a, y_b], dim=dim), y_all)
        assert type(state_b) is type(state_all)
        for s, t in zip(_tuple(state_b), _tuple(state_all)):
            torch.testing.assert_close(s, t)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_unbatched_input_equals_a_batch_of_one(name):
    model = MODULES[name](dtype=D)
    x, hx = torch.randn(4, 5, dtype=D), _state(name, batch=1)
    y, state = model(x, tuple(s[:, 0] for s in _tuple(hx)) if isinstance(hx, tuple) else hx[:, 0])
    y_ref, state_ref = model(x[:, None], hx)
    torch.testing.assert_close(y, y_ref[:, 0])
    for s, t in zip(_tuple(state), _tuple(state_ref)):
        torch.testing.assert_close(s, t[:, 0])


def test_registry_names_and_the_common_keywords():
    expected = {
        "rnn": moglm.RNN,
        "multiplicative_rnn": moglm.MultiplicativeRNN,
        "mmrnn": moglm.MultiMatrixRNN,
        "mmlstm": moglm.MultiMatrixLSTM,
        "dyck_rnn": moglm.DyckRNN,
        "gru": moglm.GRU,
        "mogrifier_gru": moglm.MogrifierGRU,
        "mogrifier_rnn": moglm.MogrifierRNN,
    }
    for name, cls in expected.items():
        assert ARCHITECTURES[name] is cls
        options = {"rank": 2} if name.startswith("mogrifier") else {}
        model = cls(
            input_size=5, hidden_size=6, num_layers=2, bias=False, batch_first=True, dropout=0.1,
            state_dropout=0.2, init="torch", backend="reference", device="cpu", dtype=D, **options,
        )  # fmt: skip
        assert model.batch_first and model.dropout == 0.1 and model.state_dropout == 0.2 and not model.bias
        y, _ = model(torch.randn(2, 3, 5, dtype=D))
        assert y.shape == (2, 3, 6)


@pytest.mark.parametrize(
    "make, argument",
    [
        (lambda: moglm.RNN(5, 7, nonlinearity="sigmoid"), "nonlinearity"),
        (lambda: moglm.MogrifierRNN(5, 7, nonlinearity="gelu"), "nonlinearity"),
        (lambda: moglm.MultiplicativeRNN(5, 7, init="xavier"), "init"),
        (lambda: moglm.MultiMatrixRNN(5, 7, num_matrices=0), "num_matrices"),
        (lambda: moglm.MultiMatrixLSTM(5, 7, num_matrices=2.0), "num_matrices"),
        (lambda: moglm.MultiMatrixLSTM(5, 7, num_matrices=True), "num_matrices"),
        (lambda: moglm.DyckRNN(5, 0), "hidden_size"),
        (lambda: moglm.DyckRNN(5, 7, num_layers=0), "num_layers"),
        (lambda: moglm.GRU(0, 7), "input_size"),
        (lambda: moglm.GRU(5, 7, dropout=1.5), "dropout"),
        (lambda: moglm.MogrifierGRU(5, 7, rounds=-1), "rounds"),
        (lambda: moglm.MogrifierGRU(5, 7, rounds=2, rank=6), "rank"),
        (lambda: moglm.MogrifierRNN(5, 7, rank=2, state_dropout=1.0), "state_dropout"),
        (lambda: moglm.MogrifierRNN(5, 7, rank=2, backend="magic"), "backend"),
        (lambda: moglm.DyckRNN.bracket_embedding(0), "num_types"),
    ],
)
def test_bad_constructor_arguments_raise_value_error_naming_the_argument(make, argument):
    with pytest.raises(ValueError, match=argument):
        make()


@pytest.mark.parametrize("name", sorted(MODULES))
def test_bad_forward_arguments_raise_value_error_naming_the_argument(name):
    model = MODULES[name]()
    x = torch.randn(4, 3, 5)
    hx = tuple(s.float() for s in _tuple(_state(name)))

    def packed(tensors):
        return tensors[0] if len(tensors) == 1 else tuple(tensors)

    for inp in (torch.randn(4, 3, 6), x.double(), torch.randn(0, 3, 5)):
        with pytest.raises(ValueError, match="input"):
            model(inp, packed(hx))
    for j in range(len(hx)):
        wrong = list(hx)
        wrong[j] = torch.zeros(2, 3, hx[j].shape[-1] + 1)  # wrong size (a key of the wrong K ...)
        with pytest.raises(ValueError, match=rf"hx\[{j}\]"):
            model(x, packed(wrong))
    with pytest.raises(ValueError, match="hx"):
        model(x, (*hx, hx[0]))  # one state tensor too many


@pytest.mark.parametrize("name", sorted(MODULES))
def test_state_dropout_acts_only_in_training(name):
    model = MODULES[name](state_dropout=0.5, dtype=D).eval()
    x, hx = torch.randn(6, 3, 5, dtype=D), _state(name)
    y_eval, _ = model(x, hx)
    torch.testing.assert_close(model(x, hx)[0], y_eval)
    model.train()
    torch.manual_seed(1)
    y1, _ = model(x, hx)
    torch.manual_seed(2)
    y2, _ = model(x, hx)
    assert not torch.allclose(y1, y2)
    assert not torch.allclose(y1, y_eval)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_dtype_moves_and_state_dict_round_trip(name):
    model = MODULES[name]()
    x = torch.randn(4, 3, 5)
    model64 = copy.deepcopy(model).to(torch.float64)
    torch.testing.assert_close(model64(x.double())[0].float(), model(x)[0], rtol=1e-4, atol=1e-5)
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    fresh = MODULES[name]()
    fresh.load_state_dict(torch.load(buffer, weights_only=True))
    torch.testing.assert_close(fresh(x)[0], model(x)[0], rtol=0, atol=0)
    assert not list(model.buffers())


def test_repr_shows_the_configuration():
    assert repr(moglm.RNN(3, 4, nonlinearity="relu", bias=False)) == "RNN(3, 4, nonlinearity=relu, bias=False)"
    assert repr(moglm.MultiMatrixLSTM(3, 4, 2, num_matrices=3, dropout=0.5)) == (
        "MultiMatrixLSTM(3, 4, num_layers=2, num_matrices=3, dropout=0.5)"
    )
    assert repr(moglm.MogrifierGRU(3, 4, rounds=2, rank=0)) == "MogrifierGRU(3, 4, rounds=2, rank=0)"
    assert repr(moglm.DyckRNN(1, 4, state_dropout=0.25)) == "DyckRNN(1, 4, state_dropout=0.25)"
    assert repr(moglm.GRU(3, 4)) == "GRU(3, 4)"


@pytest.mark.parametrize("name", ["mmlstm", "mogrifier_gru"])
def test_torch_export_of_forward_matches_eager(name):
    model = MODULES[name]().eval()
    x = torch.randn(4, 3, 5)
    state = tuple(s.float() for s in _tuple(_state(name)))
    state = state[0] if len(state) == 1 else state
    exported = torch.export.export(model, (x, state))
    y, final = exported.module()(x, state)
    y_ref, final_ref = model(x, state)
    torch.testing.assert_close(y, y_ref)
    for s, t in zip(_tuple(final), _tuple(final_ref)):
        torch.testing.assert_close(s, t)
