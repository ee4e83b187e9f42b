"""The other recurrent architectures as drop-in modules with torch.nn.LSTM's interface.

Elman RNN and GRU (torch.nn.RNN's / torch.nn.GRU's parameter names: their state dicts load), and the
input-dependent ones: multiplicative RNN, multi-matrix RNN and LSTM, Dyck-RNN, Mogrifier GRU and
Mogrifier Elman RNN. Each is a :class:`~moglm.stack.RecurrentStack` of one cell type from
:mod:`moglm.cells`; single-state ones return h_n as a tensor, like torch.nn.RNN / torch.nn.GRU.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from .cells.base import Cell
from .cells.dyck_rnn import DyckRNNCell, bracket_embedding_table
from .cells.gru import GRUCell
from .cells.mogrifier import round_matrices
from .cells.mogrifier_variants import MogrifierGRUCell, MogrifierRNNCell
from .cells.multi_matrix import MultiMatrixLSTMCell, MultiMatrixRNNCell
from .cells.rnn import MultiplicativeRNNCell, RNNCell
from .stack import RecurrentStack, check_num_layers


def _layers(num_layers: int, input_size: int, hidden_size: int, make: Callable[[int], Cell]) -> list[Cell]:
    """One cell per layer, ``make(layer input size)``: layer 0 reads the input, the others the layer below."""
    return [make(input_size if k == 0 else hidden_size) for k in range(check_num_layers(num_layers))]


class RNN(RecurrentStack):
    """Multi-layer Elman RNN, a drop-in for torch.nn.RNN (unidirectional): ``h = tanh(W_ih x + b_ih + W_hh h + b_hh)``.

    Args beyond torch.nn.RNN's: ``state_dropout`` (variational dropout on h_prev), ``init`` (``"paper"``:
    truncated normals at sqrt(1/fan_in); ``"torch"``: torch.nn.RNN's uniform) and ``backend``.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        nonlinearity: str = "tanh",
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        state_dropout: float = 0.0,
        init: str = "paper",
        backend: str = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        cells = _layers(
            num_layers, input_size, hidden_size, lambda m: RNNCell(m, hidden_size, bias, nonlinearity, init)
        )
        super().__init__(cells, batch_first, dropout, state_dropout, backend, device, dtype)

    def _repr_options(self) -> list[tuple[str, object]]:
        return [("nonlinearity", "tanh")]


class MultiplicativeRNN(RecurrentStack):
    """Multi-layer multiplicative RNN (Sutskever et al. 2011; Krause's thesis, eq. 2.26-2.28):
    ``m = (W_mx x) * (W_mh h_prev)``, ``h = tanh(W_ih x + b_ih + W_hh m + b_hh)``. Arguments as :class:`RNN`."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        nonlinearity: str = "tanh",
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        state_dropout: float = 0.0,
        init: str = "paper",
        backend: str = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        cells = _layers(
            num_layers,
            input_size,
            hidden_size,
            lambda m: MultiplicativeRNNCell(m, hidden_size, bias, nonlinearity, init),
        )
        super().__init__(cells, batch_first, dropout, state_dropout, backend, device, dtype)

    def _repr_options(self) -> list[tuple[str, object]]:
        return [("nonlinearity", "tanh")]


class MultiMatrixRNN(RecurrentStack):
    """Multi-layer multi-matrix RNN (mmRNN, the student report's eq. 6-8): a softmax key over ``num_matrices``
    shared transition matrices, carried in the state. ``hx``/``h_n`` are ``(h, key)``, key ``[L, B, K]``;
    a zero key means the uniform one. ``num_matrices=1`` is exactly :class:`RNN`. Other arguments as :class:`RNN`.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        num_matrices: int = 4,
        nonlinearity: str = "tanh",
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        state_dropout: float = 0.0,
        init: str = "paper",
        backend: str = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        cells = _layers(
            num_layers,
            input_size,
            hidden_size,
            lambda m: MultiMatrixRNNCell(m, hidden_size, bias, num_matrices, nonlinearity, init),
        )
        super().__init__(cells, batch_first, dropout, state_dropout, backend, device, dtype)
        self.num_matrices = num_matrices

    def _repr_options(self) -> list[tuple[str, object]]:
        return [("num_matrices", None), ("nonlinearity", "tanh")]


class MultiMatrixLSTM(RecurrentStack):
    """Multi-layer multi-matrix LSTM (mmLSTM, the student report's eq. 9-22): per gate, a softmax key over
    ``num_matrices`` shared recurrent matrices. ``hx``/``h_n`` are ``(h, c, key)``, key ``[L, B, 4K]`` (the
    i|f|j|o gates' keys); a zero key means the uniform one. ``num_matrices=1`` is exactly an LSTM.
    ``capped_input_gate`` and ``init`` as :class:`moglm.LSTM`.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        num_matrices: int = 4,
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
            lambda m: MultiMatrixLSTMCell(m, hidden_size, bias, num_matrices, capped_input_gate, init),
        )
        super().__init__(cells, batch_first, dropout, state_dropout, backend, device, dtype)
        self.num_matrices = num_matrices

    def _repr_options(self) -> list[tuple[str, object]]:
        return [("num_matrices", None), ("capped_input_gate", False)]


class DyckRNN(RecurrentStack):
    """Multi-layer Dyck-RNN (the student report's section 4.2): h is a stack (index 0 on top) pushed or
    popped by an input gate through fixed shift matrices, no nonlinearity.

    The report uses one layer, H = m for depth-m brackets and a fixed 1-d embedding
    (``bracket_embedding(k)``); its variant learns a 2-d embedding with H = 2m
    (``bracket_embedding(k, learned=True)`` into ``DyckRNN(2, 2 * m)``). Arguments as :class:`RNN`.
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
        init: str = "paper",
        backend: str = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        cells = _layers(num_layers, input_size, hidden_size, lambda m: DyckRNNCell(m, hidden_size, bias, init))
        super().__init__(cells, batch_first, dropout, state_dropout, backend, device, dtype)

    def _repr_options(self) -> list[tuple[str, object]]:
        return []

    @staticmethod
    def bracket_embedding(
        num_types: int,
        learned: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> nn.Embedding:
        """Embedding of 2k bracket tokens (ids 0..k-1 open, k..2k-1 the matching close). ``learned=False``:
        the report's frozen hand-set 1-d values (open +1..+k, close -1..-k); ``learned=True``: its
        section 6.2 variant, a trainable randomly initialised 2-d embedding (use with H = 2m)."""
        table = bracket_embedding_table(num_types, dtype=dtype)  # [2k, 1]; validates num_types
        if learned:
            return nn.Embedding(2 * num_types, 2, device=device, dtype=dtype)
        return nn.Embedding.from_pretrained(table.to(device=device), freeze=True)


class GRU(RecurrentStack):
    """Multi-layer GRU, a drop-in for torch.nn.GRU (unidirectional). ``init="paper"`` gives the update gate the
    LSTM forget gate's bias mean 1; other arguments as :class:`RNN`."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        state_dropout: float = 0.0,
        init: str = "paper",
        backend: str = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        cells = _layers(num_layers, input_size, hidden_size, lambda m: GRUCell(m, hidden_size, bias, init))
        super().__init__(cells, batch_first, dropout, state_dropout, backend, device, dtype)

    def _repr_options(self) -> list[tuple[str, object]]:
        return []


class _MogrifierRoundsAccess:
    """``mogrify(x, h, layer)`` and ``round_matrices(layer)`` of a stack of mogrifier cells, for analysis."""

    def _set_rounds(self) -> None:
        cell = self.cells[0]
        self.rounds, self.rank, self.zigzag = cell.rounds, cell.rank, cell.zigzag

    def _repr_options(self) -> list[tuple[str, object]]:
        return [("rounds", None), ("rank", None), ("zigzag", True)]

    def mogrify(self, x: Tensor, h: Tensor, layer: int = 0) -> tuple[Tensor, Tensor]:
        """One step's rounds at ``layer``: ``x`` ``[B, m]``, ``h`` ``[B, H]`` -> ``(x_up, h_up)``."""
        params = self.layer_parameters(layer)  # raises on a bad layer index
        cell = self.cells[layer]
        for name, t, size in (("x", x, cell.input_size), ("h", h, cell.hidden_size)):
            if t.shape[-1] != size:
                raise ValueError(f"{name}: last dimension must be {size} at layer {layer}, got {t.shape[-1]}")
        return cell.mogrify(params, x, h)

    def round_matrices(self, layer: int = 0) -> list[Tensor]:
        """Dense Q_1, R_2, Q_3, ... of ``layer`` in round order (Q_i ``[m, H]``, R_i ``[H, m]``)."""
        return round_matrices(self.layer_parameters(layer), self.rounds)


class MogrifierGRU(_MogrifierRoundsAccess, RecurrentStack):
    """Multi-layer Mogrifier GRU (the Mogrifier paper's section 5, future work): GRU gates from
    ``mogrify(x, h_prev)``, interpolation ``(1 - z) n + z h_prev`` to the unmogrified h_prev.
    ``rounds=0`` is exactly torch.nn.GRU. ``rounds``, ``rank``, ``zigzag`` as :class:`moglm.MogrifierLSTM`."""

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
        init: str = "paper",
        backend: str = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        cells = _layers(
            num_layers,
            input_size,
            hidden_size,
            lambda m: MogrifierGRUCell(m, hidden_size, bias, rounds, rank, zigzag, init),
        )
        super().__init__(cells, batch_first, dropout, state_dropout, backend, device, dtype)
        self._set_rounds()


class MogrifierRNN(_MogrifierRoundsAccess, RecurrentStack):
    """Multi-layer Mogrifier Elman RNN (the Mogrifier paper's section 5, future work):
    ``h = tanh(W_ih x_up + b_ih + W_hh h_up + b_hh)`` with ``(x_up, h_up) = mogrify(x, h_prev)``.
    ``rounds=0`` is exactly torch.nn.RNN. Arguments as :class:`MogrifierGRU` and :class:`RNN`."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        rounds: int = 5,
        rank: int = 40,
        nonlinearity: str = "tanh",
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        state_dropout: float = 0.0,
        zigzag: bool = True,
        init: str = "paper",
        backend: str = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        cells = _layers(
            num_layers,
            input_size,
            hidden_size,
            lambda m: MogrifierRNNCell(m, hidden_size, bias, rounds, rank, zigzag, nonlinearity, init),
        )
        super().__init__(cells, batch_first, dropout, state_dropout, backend, device, dtype)
        self._set_rounds()

    def _repr_options(self) -> list[tuple[str, object]]:
        return super()._repr_options() + [("nonlinearity", "tanh")]
