"""Drop-in recurrent modules with torch.nn.LSTM's interface: LSTM, Mogrifier LSTM, multiplicative LSTM.

Each is a :class:`~moglm.stack.RecurrentStack` of one cell type. LSTM parameters carry torch.nn.LSTM's
exact names, so ``moglm.LSTM(...).load_state_dict(nn_lstm.state_dict())`` works (and so does a
``MogrifierLSTM`` with ``rounds=0``).
"""

from __future__ import annotations

import torch
from torch import nn

from .cells.lstm import LSTMCell
from .cells.mogrifier import MogrifierLSTMCell, reset_mogrifier_parameters
from .cells.multiplicative_lstm import MultiplicativeLSTMCell
from .modules_rnn import (
    GRU,
    RNN,
    DyckRNN,
    MogrifierGRU,
    MogrifierRNN,
    MultiMatrixLSTM,
    MultiMatrixRNN,
    MultiplicativeRNN,
    _layers,
    _MogrifierRoundsAccess,
)
from .stack import RecurrentStack


class LSTM(RecurrentStack):
    """Multi-layer LSTM, a drop-in for torch.nn.LSTM (unidirectional, no projection).

    Args beyond torch.nn.LSTM's: ``state_dropout`` (variational dropout on h_prev), ``capped_input_gate``
    (the paper's ``c = f*c + min(1-f, i)*j``), ``init`` (``"paper"``: the truncated normals of
    docs/method.md, "Initialisation"; ``"torch"``: torch.nn.LSTM's uniform) and ``backend`` (see
    :mod:`moglm.recurrence`).
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        state_dropout: float = 0.0,
        capped_input_gate: bool = False,
        init: str = "paper",
        backend: str = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        cells = _layers(
            num_layers, input_size, hidden_size, lambda m: LSTMCell(m, hidden_size, bias, capped_input_gate, init)
        )
        super().__init__(cells, batch_first, dropout, state_dropout, backend, device, dtype)


class MultiplicativeLSTM(RecurrentStack):
    """Multi-layer multiplicative LSTM (Krause et al. 2016): ``m = (W_mx x) * (W_mh h_prev)`` replaces h_prev.

    Not xLSTM's matrix-memory "mLSTM". Arguments as :class:`LSTM`.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        state_dropout: float = 0.0,
        capped_input_gate: bool = False,
        init: str = "paper",
        backend: str = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        cells = _layers(
            num_layers,
            input_size,
            hidden_size,
            lambda m: MultiplicativeLSTMCell(m, hidden_size, bias, capped_input_gate, init),
        )
        super().__init__(cells, batch_first, dropout, state_dropout, backend, device, dtype)


class MogrifierLSTM(_MogrifierRoundsAccess, RecurrentStack):
    """Multi-layer Mogrifier LSTM (Melis et al. 2020).

    Args:
        rounds: mogrifier rounds r >= 0 (0 is exactly an LSTM).
        rank: rank k of each Q_i / R_i; k <= 0 means full rank.
        zigzag: ``False`` gives the paper's no-zigzag ablation (every round sees the original x and h).
        other arguments: as :class:`LSTM`.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        rounds: int = 5,
        rank: int = 40,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        state_dropout: float = 0.0,
        zigzag: bool = True,
        capped_input_gate: bool = False,
        init: str = "paper",
        backend: str = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        cells = _layers(
            num_layers,
            input_size,
            hidden_size,
            lambda m: MogrifierLSTMCell(m, hidden_size, bias, rounds, rank, zigzag, capped_input_gate, init),
        )
        super().__init__(cells, batch_first, dropout, state_dropout, backend, device, dtype)
        self._set_rounds()

    def _repr_options(self) -> list[tuple[str, object]]:
        return [*super()._repr_options(), ("capped_input_gate", False)]

    @classmethod
    def from_lstm(cls, lstm: nn.Module, rounds: int = 5, rank: int = 40, **kwargs) -> "MogrifierLSTM":
        """Warm start from a trained torch.nn.LSTM (or plain :class:`moglm.LSTM`).

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
            capped_input_gate=any(getattr(c, "capped_input_gate", False) for c in getattr(lstm, "cells", [])),
            state_dropout=getattr(lstm, "state_dropout", 0.0),
            device=weight.device,
            dtype=weight.dtype,
        )
        options.update(kwargs)
        model = cls(lstm.input_size, lstm.hidden_size, lstm.num_layers, rounds, rank, **options)
        with torch.no_grad():
            for name, tensor in lstm.state_dict().items():
                getattr(model, name).copy_(tensor)
            for k in range(model.num_layers):
                reset_mogrifier_parameters(model.layer_parameters(k), model.rank, identity=True)
        return model


#: Architecture name (as used in configs) -> module class. Every class takes
#: ``(input_size, hidden_size, num_layers, *, dropout, state_dropout, batch_first, ...options)``.
ARCHITECTURES: dict[str, type[RecurrentStack]] = {
    "lstm": LSTM,
    "mogrifier": MogrifierLSTM,
    "multiplicative_lstm": MultiplicativeLSTM,
    "rnn": RNN,
    "multiplicative_rnn": MultiplicativeRNN,
    "mmrnn": MultiMatrixRNN,
    "mmlstm": MultiMatrixLSTM,
    "dyck_rnn": DyckRNN,
    "gru": GRU,
    "mogrifier_gru": MogrifierGRU,
    "mogrifier_rnn": MogrifierRNN,
}
