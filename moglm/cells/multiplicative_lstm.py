"""The multiplicative LSTM step (Krause et al. 2016; Krause's thesis, section 3.3, eq. 3.5-3.9).

Not to be confused with xLSTM's matrix-memory "mLSTM": this is the mRNN/LSTM hybrid whose recurrent
input is an input-dependent factorised transition of h_prev::

    m = (W_mx x) * (W_mh h_prev)                       dim(m) = dim(h)
    [i, f, j, o] = W_ih x + W_hh m + b_ih + b_hh          an LSTM with m in place of h_prev

Parameters: the LSTM's four (``weight_hh`` acts on m) plus ``weight_mx`` ``[H, m]`` and ``weight_mh`` ``[H, H]``.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from .base import Params, State
from .initialisation import fan_in_normal_, uniform_like_torch_
from .lstm import LSTMCell, lstm_pointwise


class MultiplicativeLSTMCell(LSTMCell):
    """Krause's multiplicative LSTM: ``(x, (h, c)) -> (h', (h', c'))``."""

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes = super().parameter_shapes()
        shapes.update(weight_mx=(self.hidden_size, self.input_size), weight_mh=(self.hidden_size, self.hidden_size))
        return shapes

    def reset_parameters(self, params: Params) -> None:
        super().reset_parameters(params)
        if self.init == "torch":
            uniform_like_torch_(params["weight_mx"], self.hidden_size)
            uniform_like_torch_(params["weight_mh"], self.hidden_size)
        else:
            fan_in_normal_(params["weight_mx"], self.input_size)
            fan_in_normal_(params["weight_mh"], self.hidden_size)

    def intermediate(self, params: Params, x: Tensor, h: Tensor) -> Tensor:
        """``m = (W_mx x) * (W_mh h)``, ``[B, H]`` (eq. 3.5)."""
        return F.linear(x, params["weight_mx"]) * F.linear(h, params["weight_mh"])

    def step(self, params: Params, x: Tensor, state: State) -> tuple[Tensor, State]:
        h_prev, c_prev = state
        m = self.intermediate(params, x, h_prev)  # [B, H]
        h, c = lstm_pointwise(self.gates(params, x, m), c_prev, self.capped_input_gate)
        return h, (h, c)
