"""The Mogrifier modules: Mogrifier LSTM (Melis et al. 2020), Mogrifier GRU and Mogrifier Elman RNN.

Each is the mogrifier rounds (the paper's eq. 1-2, :mod:`moglm.cells.mogrifier`) in front of a cell, with the
options ``rounds``, ``rank`` and ``zigzag``; ``rounds=0`` is exactly the cell, so torch.nn.LSTM's, GRU's and
RNN's state dicts load into ``rounds=0`` models. ``rank=None`` (the default) is chosen per layer from its sizes:
the paper's 40 where the layer's input and hidden sizes are both at least 40, else full rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..cells.mogrifier import MogrifierLSTMCell, reset_mogrifier_parameters, round_matrices
from ..cells.mogrifier_variants import MogrifierGRUCell, MogrifierRNNCell
from .base import RecurrentModule
from .options import CappedInputGateOption, MogrifierRoundsOption, NonlinearityOption


class MogrifierStack(RecurrentModule):
    """The analysis methods of a stack of mogrifier cells: one step's rounds and the dense round matrices."""

    def mogrify(self, x: Tensor, h: Tensor, layer: int = 0) -> tuple[Tensor, Tensor]:
        """One step's rounds at ``layer``: ``x`` ``[B, m]``, ``h`` ``[B, H]`` -> ``(x_up, h_up)`` (eq. 1-2)."""
        params = self.layer_parameters(layer)  # raises on a bad layer index
        cell = self.cells[layer]
        for name, t, size in (("x", x, cell.input_size), ("h", h, cell.hidden_size)):
            if t.shape[-1] != size:
                raise ValueError(f"{name}: last dimension must be {size} at layer {layer}, got {t.shape[-1]}")
        return cell.mogrify(params, x, h)

    def round_matrices(self, layer: int = 0) -> list[Tensor]:
        """Dense Q_1, R_2, Q_3, ... of ``layer`` in round order (Q_i ``[m, H]``, R_i ``[H, m]``)."""
        return round_matrices(self.layer_parameters(layer), self.rounds)


class MogrifierLSTM(MogrifierStack):
    """Multi-layer Mogrifier LSTM (Melis et al. 2020, section 2): ``LSTM(x_up, c_prev, h_up)`` with
    ``(x_up, h_up)`` the input and h_prev after ``rounds`` rounds of mutual gating. Positional arguments are
    torch.nn.LSTM's; ``rounds=0`` is exactly torch.nn.LSTM (its state dict loads)."""

    @dataclass
    class Options(CappedInputGateOption, MogrifierRoundsOption):
        """Options of :class:`MogrifierLSTM`."""

    cell_class = MogrifierLSTMCell

    @classmethod
    def from_lstm(cls, lstm: nn.Module, **kwargs: Any) -> MogrifierLSTM:
        """Warm start from a trained torch.nn.LSTM (or :class:`moglm.LSTM`); ``kwargs`` are the constructor's
        keywords (``rounds``, ``rank``, ``state_dropout`` ...), the rest is taken from ``lstm``.

        The LSTM weights are copied and every mogrifier gate starts at exactly 1 (zero left factors /
        zero full-rank matrices, zero biases), so the new model computes what the LSTM computed. The
        right factors are random, so gradients reach the mogrifier and it can learn.
        """
        if getattr(lstm, "bidirectional", False) or getattr(lstm, "proj_size", 0):
            raise ValueError("lstm: bidirectional or projected LSTMs cannot be converted")
        if not all(hasattr(lstm, a) for a in ("input_size", "hidden_size", "num_layers", "weight_ih_l0")):
            raise ValueError(f"lstm must be a torch.nn.LSTM or moglm.LSTM, got {type(lstm).__name__}")
        weight = lstm.weight_ih_l0
        options = dict(
            bias=lstm.bias,
            batch_first=lstm.batch_first,
            dropout=float(lstm.dropout),
            capped_input_gate=getattr(lstm, "capped_input_gate", False),
            state_dropout=getattr(lstm, "state_dropout", 0.0),
            device=weight.device,
            dtype=weight.dtype,
        )
        options.update(kwargs)
        model = cls(lstm.input_size, lstm.hidden_size, lstm.num_layers, **options)
        with torch.no_grad():
            for name, tensor in lstm.state_dict().items():
                getattr(model, name).copy_(tensor)
            for k, cell in enumerate(model.cells):
                reset_mogrifier_parameters(model.layer_parameters(k), cell.rank, identity=True)
        return model


class MogrifierGRU(MogrifierStack):
    """Multi-layer Mogrifier GRU (the Mogrifier paper's section 5, future work): GRU gates from
    ``mogrify(x, h_prev)``, interpolation ``(1 - z) n + z h_prev`` to the unmogrified h_prev.
    ``rounds=0`` is exactly torch.nn.GRU."""

    @dataclass
    class Options(MogrifierRoundsOption):
        """Options of :class:`MogrifierGRU`."""

    cell_class = MogrifierGRUCell


class MogrifierRNN(MogrifierStack):
    """Multi-layer Mogrifier Elman RNN (the Mogrifier paper's section 5, future work):
    ``h = tanh(W_ih x_up + b_ih + W_hh h_up + b_hh)`` with ``(x_up, h_up) = mogrify(x, h_prev)``.
    ``rounds=0`` is exactly torch.nn.RNN, whose positional arguments (``nonlinearity`` fourth) it takes."""

    @dataclass
    class Options(NonlinearityOption, MogrifierRoundsOption):
        """Options of :class:`MogrifierRNN`."""

    cell_class = MogrifierRNNCell
    positional_options = ("nonlinearity",)
