"""The GRU step (Cho et al. 2014) in torch.nn.GRU's layout: gate blocks ordered reset r, update z, new n::

    [r_x, z_x, n_x] = W_ih x + b_ih            [r_h, z_h, n_h] = W_hh h_prev + b_hh
    r = sigmoid(r_x + r_h)       z = sigmoid(z_x + z_h)       n = tanh(n_x + r * n_h)
    h = (1 - z) * n + z * h_prev

The same names as torch.nn.GRU (``weight_ih`` ``[3H, m]``, ``weight_hh`` ``[3H, H]``, ``bias_ih``, ``bias_hh``),
so a trained torch.nn.GRU's state dict loads. In a GRU h_prev is both the gates' input and the memory, so
the stack's state dropout (which masks h_prev) also reaches the interpolation ``z * h_prev``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import Cell, Params, State
from .lstm import check_init, reset_lstm_parameters
from .rnn import rnn_parameter_shapes


def gru_pointwise(gi: Tensor, gh: Tensor, h_prev: Tensor) -> Tensor:
    """GRU output from input pre-activations ``gi`` and recurrent ones ``gh`` (each ``[B, 3H]``, r|z|n)."""
    r_x, z_x, n_x = gi.chunk(3, dim=-1)  # each [B, H]
    r_h, z_h, n_h = gh.chunk(3, dim=-1)  # each [B, H]
    r = torch.sigmoid(r_x + r_h)
    z = torch.sigmoid(z_x + z_h)
    n = torch.tanh(n_x + r * n_h)  # [B, H]
    return (1.0 - z) * n + z * h_prev  # [B, H]


class GRUCell(Cell):
    """GRU step ``(x, (h,)) -> (h', (h',))``, torch.nn.GRUCell's computation.

    ``init="paper"`` is the LSTM scheme of :func:`~moglm.cells.lstm.reset_lstm_parameters` (gate blocks
    truncated normal std sqrt(1/fan_in), ``bias_ih`` random at the hidden scale, ``bias_hh`` zero) with the
    forget gate's bias mean 1 given to the update gate z, its counterpart (z = 1 keeps h_prev).
    ``init="torch"``: torch.nn.GRU's uniform.
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, init: str = "paper") -> None:
        super().__init__(input_size, hidden_size, bias)
        self.init = check_init(init)

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        return rnn_parameter_shapes(self.input_size, self.hidden_size, self.bias, blocks=3)

    def reset_parameters(self, params: Params) -> None:
        # the LSTM's rows [H, 2H] (forget gate, bias mean 1) are the GRU's update gate z
        reset_lstm_parameters(params, self.input_size, self.hidden_size, self.init)

    def update(self, params: Params, x: Tensor, h_gates: Tensor, h_prev: Tensor) -> Tensor:
        """GRU output ``[B, H]`` with gates computed from ``x`` and ``h_gates`` and interpolating to ``h_prev``."""
        gi = F.linear(x, params["weight_ih"], params.get("bias_ih"))  # [B, 3H]
        gh = F.linear(h_gates, params["weight_hh"], params.get("bias_hh"))  # [B, 3H]
        return gru_pointwise(gi, gh, h_prev)

    def step(self, params: Params, x: Tensor, state: State) -> tuple[Tensor, State]:
        (h_prev,) = state
        h = self.update(params, x, h_prev, h_prev)  # [B, H]
        return h, (h,)
