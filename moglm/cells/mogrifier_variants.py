"""The mogrifier rounds around other cells: Mogrifier GRU and Mogrifier Elman RNN (Melis et al. 2020, section 5).

The paper notes that the Mogrifier is "a series of preprocessing steps composed with the LSTM function"
and leaves the Mogrifier GRU and Mogrifier Elman network to future work. Here the preprocessing is the
same :func:`~moglm.cells.mogrifier.mogrify` (eq. 1-2, same parameters, names and initialisation), and
the composed function is the GRU or the Elman step::

    (x_up, h_up) = mogrify(x, h_prev)                      r rounds, x first
    Mogrifier RNN:  h = tanh(W_ih x_up + b_ih + W_hh h_up + b_hh)
    Mogrifier GRU:  [r, z, n] gates of the GRU computed from (x_up, h_up)    (n = tanh(.. + r * (W_hn h_up + b_hn)))
                    h = (1 - z) * n + z * h_prev             <- h_prev NOT mogrified

The GRU's interpolation carries h_prev unchanged, in the spirit of the Mogrifier LSTM, where the mogrified
h only computes the gates and the memory c_prev reaches the update unmogrified: in a GRU h_prev is both
the gate input (the LSTM's h) and the memory (the LSTM's c). Keeping it out of the mogrifier also keeps
h a convex combination of n and h_prev, so |h| <= 1 still holds (mogrified h can be up to 2^(r/2) h_prev).
With ``rounds=0``, or with every round gate at 1, both cells compute exactly the GRU / Elman RNN.
"""

from __future__ import annotations

from torch import Tensor

from .base import Params, State
from .gru import GRUCell
from .mogrifier import MogrifierRounds
from .rnn import RNNCell


class MogrifierGRUCell(MogrifierRounds, GRUCell):
    """Mogrifier GRU step: GRU gates from ``mogrify(x, h_prev)``, interpolation to the unmogrified h_prev."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        bias: bool = True,
        rounds: int = 5,
        rank: int | None = None,
        zigzag: bool = True,
        init: str = "paper",
    ) -> None:
        super().__init__(input_size, hidden_size, bias, init)
        self._init_rounds(rounds, rank, zigzag)

    def step(self, params: Params, x: Tensor, state: State) -> tuple[Tensor, State]:
        (h_prev,) = state
        x_up, h_up = self.mogrify(params, x, h_prev)  # [B, m], [B, H]
        h = self.update(params, x_up, h_up, h_prev)  # [B, H]
        return h, (h,)


class MogrifierRNNCell(MogrifierRounds, RNNCell):
    """Mogrifier Elman step: ``nonlinearity(W_ih x_up + b_ih + W_hh h_up + b_hh)``."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        bias: bool = True,
        rounds: int = 5,
        rank: int | None = None,
        zigzag: bool = True,
        nonlinearity: str = "tanh",
        init: str = "paper",
    ) -> None:
        super().__init__(input_size, hidden_size, bias, nonlinearity, init)
        self._init_rounds(rounds, rank, zigzag)

    def step(self, params: Params, x: Tensor, state: State) -> tuple[Tensor, State]:
        (h_prev,) = state
        x_up, h_up = self.mogrify(params, x, h_prev)  # [B, m], [B, H]
        h = self.update(params, x_up, h_up)  # [B, H]
        return h, (h,)
