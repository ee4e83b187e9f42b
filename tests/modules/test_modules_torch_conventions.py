"""Every module follows torch.nn.LSTM / GRU / RNN's conventions: positional arguments mean what they mean
for torch, options are keyword-only and typed (``cls.Options``), torch's initialisation by default, and
every architecture builds at tiny sizes with its default options."""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing

import pytest
import torch
from torch import nn

import moglm
from moglm.modules import ARCHITECTURES
from moglm.recurrence import BACKENDS

D = torch.float64
M, H, L = 5, 7, 2

#: architecture -> (the torch module it is constructed like, options that make it compute exactly that module)
TORCH_TWIN = {
    "lstm": (nn.LSTM, {}),
    "mogrifier": (nn.LSTM, {"rounds": 0}),
    "gru": (nn.GRU, {}),
    "mogrifier_gru": (nn.GRU, {"rounds": 0}),
    "rnn": (nn.RNN, {}),
    "mogrifier_rnn": (nn.RNN, {"rounds": 0}),
}


def _is_rnn_like(cls):
    """Constructed like torch.nn.RNN: ``nonlinearity`` fourth."""
    return "nonlinearity" in cls.positional_options


def _positional(cls, batch_first=True):
    """The positional arguments after the sizes and layers, in torch's order: bias, batch_first, dropout
    (nn.RNN: nonlinearity first). All differ from the defaults."""
    return ("relu", False, batch_first, 0.25) if _is_rnn_like(cls) else (False, batch_first, 0.25)


def _tuple(state):
    return (state,) if isinstance(state, torch.Tensor) else tuple(state)


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_positional_arguments_mean_what_they_mean_for_torch(name):
    cls = ARCHITECTURES[name]
    model = cls(M, H, L, *_positional(cls), dtype=D)
    assert (model.input_size, model.hidden_size, model.num_layers) == (M, H, L)
    assert model.bias is False and model.batch_first is True and model.dropout == 0.25
    assert not any("bias" in n for n, _ in model.named_parameters())
    if _is_rnn_like(cls):
        assert model.nonlinearity == "relu" and all(cell.nonlinearity == "relu" for cell in model.cells)
    if name in TORCH_TWIN:  # the torch module constructed with the same positional arguments agrees
        torch_cls, options = TORCH_TWIN[name]
        ref = torch_cls(M, H, L, *_positional(cls), dtype=D)
        for attribute in ("input_size", "hidden_size", "num_layers", "bias", "batch_first", "dropout"):
            assert getattr(model, attribute) == getattr(ref, attribute), attribute
        if _is_rnn_like(cls):
            assert ref.nonlinearity == model.nonlinearity
        exact = cls(M, H, L, *_positional(cls), dtype=D, **options).eval()
        exact.load_state_dict(ref.state_dict())
        x = torch.randn(3, 4, M, dtype=D)  # [B, T, m]: batch first
        y, state = exact(x)
        y_ref, state_ref = ref.eval()(x)
        torch.testing.assert_close(y, y_ref)
        for s, t in zip(_tuple(state), _tuple(state_ref)):
            torch.testing.assert_close(s, t)


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_batch_first_input_gives_the_transposed_time_major_result(name):
    cls = ARCHITECTURES[name]
    first = cls(M, H, L, *_positional(cls, batch_first=True), dtype=D).eval()
    major = cls(M, H, L, *_positional(cls, batch_first=False), dtype=D).eval()
    major.load_state_dict(first.state_dict())
    x = torch.randn(3, 4, M, dtype=D)  # [B, T, m]
    y, state = first(x)  # [B, T, H]
    y_major, state_major = major(x.transpose(0, 1))  # [T, B, H]
    assert y.shape == (3, 4, H)
    torch.testing.assert_close(y, y_major.transpose(0, 1))
    for s, t in zip(_tuple(state), _tuple(state_major)):
        torch.testing.assert_close(s, t)


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_more_positional_arguments_than_torch_takes_are_refused(name):
    cls = ARCHITECTURES[name]
    with pytest.raises(TypeError, match=rf"{cls.__name__}\(\): too many positional arguments"):
        cls(M, H, L, *_positional(cls), False)  # torch's next one, bidirectional, is not supported
    with pytest.raises(TypeError, match="unexpected keyword argument 'ranks'"):
        cls(M, H, ranks=3)


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_options_are_a_typed_documented_dataclass_and_exactly_the_keyword_only_options(name):
    cls = ARCHITECTURES[name]
    assert dataclasses.is_dataclass(cls.Options)
    fields = dataclasses.fields(cls.Options)
    hints = typing.get_type_hints(cls.Options)
    for f in fields:
        assert f.metadata.get("help"), f"{name}: {f.name} has no help"
        assert not isinstance(hints[f.name], str)
        assert f.name in cls.__doc__, f"{name}: {f.name} is missing from the docstring"
    parameters = inspect.signature(cls).parameters
    stack = ("state_dropout", "init", "backend", "device", "dtype")
    keyword_only = [n for n, p in parameters.items() if p.kind is p.KEYWORD_ONLY and n not in stack]
    assert sorted(keyword_only + list(cls.positional_options)) == sorted(f.name for f in fields)
    assert list(parameters)[:3] == ["input_size", "hidden_size", "num_layers"]
    options = cls.Options()
    model = cls(M, H, L, **dataclasses.asdict(options))
    assert model.options == options
    for f in fields:
        assert getattr(model, f.name) == getattr(options, f.name)


def test_options_reach_the_cells():
    options = moglm.MogrifierLSTM.Options(rounds=3, rank=2, zigzag=False, capped_input_gate=True)
    model = moglm.MogrifierLSTM(M, H, L, **dataclasses.asdict(options))
    for cell in model.cells:
        assert (cell.rounds, cell.rank, cell.zigzag, cell.capped_input_gate) == (3, 2, False, True)
    assert moglm.MultiMatrixRNN(M, H, num_matrices=3).cells[0].num_matrices == 3


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_every_architecture_builds_and_runs_at_tiny_sizes_with_default_options(name):
    model = ARCHITECTURES[name](3, 5, 2, dtype=D)
    y, state = model(torch.randn(4, 2, 3, dtype=D))
    assert y.shape == (4, 2, 5)
    y.sum().backward()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_an_empty_batch_gives_empty_outputs_and_states_as_torch_does(name, backend):
    """torch.nn.LSTM returns ``[T, 0, H]`` and ``[L, 0, H]`` states for a batch of 0 rows, on the graph; so
    does every architecture on every backend that runs it (one that cannot run the cell refuses as it would
    for any batch), in training mode with every dropout, with and without ``hx``, batch-first too."""
    cls = ARCHITECTURES[name]
    options = {"dropout": 0.25, "state_dropout": 0.25, "backend": backend}
    model = cls(3, 5, 2, dtype=D, **options).train()
    try:
        model(torch.randn(4, 2, 3, dtype=D))
    except ValueError as e:  # the backend cannot run this cell at all
        with pytest.raises(ValueError, match=re.escape(str(e))):
            model(torch.randn(4, 0, 3, dtype=D))
        return
    sizes = model.cells[-1].state_sizes()
    x = torch.randn(4, 0, 3, dtype=D, requires_grad=True)
    for hx in (None, model.zero_state(0)):
        y, state = model(x, hx)
        assert y.shape == (4, 0, 5) and y.requires_grad
        assert [tuple(s.shape) for s in _tuple(state)] == [(2, 0, n) for n in sizes]
        (y.sum() + sum(s.sum() for s in _tuple(state))).backward()
        assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
    batch_first = cls(3, 5, 2, *(("tanh",) if _is_rnn_like(cls) else ()), True, True, dtype=D, **options)
    y, state = batch_first(torch.randn(0, 4, 3, dtype=D))
    assert y.shape == (0, 4, 5) and [tuple(s.shape) for s in _tuple(state)] == [(2, 0, n) for n in sizes]
    if name in TORCH_TWIN:
        ref_y, ref_state = TORCH_TWIN[name][0](3, 5, 2, dtype=D)(torch.randn(4, 0, 3, dtype=D))
        assert ref_y.shape == (4, 0, 5) and [s.shape for s in _tuple(ref_state)] == [s.shape for s in _tuple(
            model(x)[1])]


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_no_time_steps_is_a_value_error_saying_so_as_torch_refuses_it(name):
    with pytest.raises(RuntimeError, match="sequence length"):
        nn.LSTM(3, 5)(torch.randn(0, 2, 3))
    with pytest.raises(ValueError, match=r"no time steps \(sequence length 0"):
        ARCHITECTURES[name](3, 5, 2, dtype=D)(torch.randn(0, 2, 3, dtype=D))


def test_default_rank_is_the_papers_where_it_fits_else_full_rank():
    assert [c.rank for c in moglm.MogrifierLSTM(3, 5, 2).cells] == [0, 0]  # tiny: full rank
    assert [c.rank for c in moglm.MogrifierLSTM(16, 64, 2).cells] == [0, 40]  # per layer, from its own sizes
    assert [c.rank for c in moglm.MogrifierGRU(40, 40).cells] == [40]
    assert [c.rank for c in moglm.MogrifierRNN(39, 400).cells] == [0]
    assert moglm.MogrifierLSTM(3, 5).rank is None  # the attribute is the argument, as torch's
    assert [c.rank for c in moglm.MogrifierLSTM(16, 64, 2, rank=-1).cells] == [0, 0]
    with pytest.raises(ValueError, match="rank"):
        moglm.MogrifierLSTM(3, 5, rank=4)  # an explicit rank is not clamped


@pytest.mark.parametrize("moglm_cls, torch_cls", [(moglm.LSTM, nn.LSTM), (moglm.GRU, nn.GRU), (moglm.RNN, nn.RNN)])
def test_default_init_is_torchs_so_swapping_a_torch_module_changes_nothing(moglm_cls, torch_cls):
    torch.manual_seed(0)
    ref = torch_cls(M, H, L)
    torch.manual_seed(0)
    ours = moglm_cls(M, H, L)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]
    for p, q in zip(ours.parameters(), ref.parameters()):
        assert torch.equal(p, q)
    paper = moglm_cls(M, H, L, init="paper")
    assert paper.init == "paper" and all(cell.init == "paper" for cell in paper.cells)
