"""The multiplicative-integration LSTM step (MI-LSTM; Wu et al. 2016; Krause's thesis, section 2.4.3, eq. 2.29,
and table 3.1's MI-LSTM beside the mLSTM).

Multiplicative integration joins the input's and the recurrent contribution by a Hadamard product instead of
a sum (eq. 2.29 for the vanilla RNN: ``h^ = W_hx x * W_hh h_prev``). In the general form of Wu et al., each of
the LSTM's four gate pre-activations is::

    a = alpha * (W_ih x) * (W_hh h_prev) + beta_h * (W_hh h_prev) + beta_x * (W_ih x) + b_ih + b_hh

with gating vectors ``alpha``, ``beta_h``, ``beta_x`` ``[4H]`` learnt beside the LSTM's weights, then the
LSTM's pointwise update. ``alpha = 0``, ``beta_h = beta_x = 1`` is exactly the LSTM. They start at
``alpha = beta_h = beta_x = 1``: the LSTM plus the second-order term.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from .base import Params, State
from .lstm import LSTMCell, lstm_pointwise

GATING = ("mi_alpha", "mi_beta_h", "mi_beta_x")


class MultiplicativeIntegrationLSTMCell(LSTMCell):
    """The MI-LSTM: ``(x, (h, c)) -> (h', (h', c'))``."""

    #: an LSTM's gates, combined otherwise: no fused or compiled window fits, the reference loop is its path
    reference_only = True

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes = super().parameter_shapes()
        shapes.update({name: (4 * self.hidden_size,) for name in GATING})
        return shapes

    def reset_parameters(self, params: Params) -> None:
        super().reset_parameters(params)
        for name in GATING:
            params[name].fill_(1.0)

    def gates(self, params: Params, x: Tensor, h: Tensor) -> Tensor:
        """Gate pre-activations ``[B, 4H]``: the general multiplicative integration of ``W_ih x`` and ``W_hh h``."""
        wx = F.linear(x, params["weight_ih"])  # [B, 4H]
        uh = F.linear(h, params["weight_hh"])  # [B, 4H]
        gates = (params["mi_alpha"] * wx + params["mi_beta_h"]) * uh + params["mi_beta_x"] * wx  # [B, 4H]
        for name in ("bias_ih", "bias_hh"):
            if name in params:
                gates = gates + params[name]
        return gates

    def step(self, params: Params, x: Tensor, state: State) -> tuple[Tensor, State]:
        h_prev, c_prev = state
        h, c = lstm_pointwise(self.gates(params, x, h_prev), c_prev, self.capped_input_gate)
        return h, (h, c)
