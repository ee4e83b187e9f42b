"""The LSTM step (Sak et al. 2014, as in the Mogrifier paper, section 2), in torch.nn.LSTM's layout.

Gate pre-activations come from one fused matrix product; the four blocks are ordered like
torch.nn.LSTM's: input i, forget f, cell candidate j (torch calls it g), output o::

    [i, f, j, o] = [x; h_prev] @ [W_ih; W_hh]^T + b_ih + b_hh
    c = f * c_prev + i * j                  (plain: the Mogrifier paper's equations, section 2, and torch.nn.LSTM)
    c = f * c_prev + min(1 - f, i) * j      (capped input gate: a departure, from the authors' released code
                                             and Melis et al. 2018's set-up, which section 3.3 follows)
    h = o * tanh(c)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import Cell, Params, State
from .initialisation import fan_in_normal_, gate_blocks_, truncated_normal_, uniform_like_torch_

INITS = ("paper", "torch")


def lstm_pointwise(gates: Tensor, c_prev: Tensor, capped_input_gate: bool) -> tuple[Tensor, Tensor]:
    """Gate nonlinearities and state update from pre-activations ``gates`` ``[B, 4H]``. Returns ``(h, c)``."""
    i, f, j, o = gates.chunk(4, dim=-1)  # each [B, H]
    i, f, o = torch.sigmoid(i), torch.sigmoid(f), torch.sigmoid(o)
    j = torch.tanh(j)
    if capped_input_gate:
        i = torch.minimum(1.0 - f, i)
    c = f * c_prev + i * j  # [B, H]
    h = o * torch.tanh(c)  # [B, H]
    return h, c


def lstm_parameter_shapes(input_size: int, hidden_size: int, bias: bool) -> dict[str, tuple[int, ...]]:
    """The four torch.nn.LSTMCell parameters (``weight_ih``, ``weight_hh``, ``bias_ih``, ``bias_hh``)."""
    shapes = {"weight_ih": (4 * hidden_size, input_size), "weight_hh": (4 * hidden_size, hidden_size)}
    if bias:
        shapes.update(bias_ih=(4 * hidden_size,), bias_hh=(4 * hidden_size,))
    return shapes


def reset_lstm_parameters(params: Params, input_size: int, hidden_size: int, init: str) -> None:
    """``paper``: per-block truncated normal, std sqrt(1/fan_in); biases random at the hidden scale with
    forget-gate mean 1 (carried by ``bias_ih``; ``bias_hh`` starts at 0). ``torch``: torch.nn.LSTM's uniform."""
    if init == "torch":
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            if name in params:
                uniform_like_torch_(params[name], hidden_size)
        return
    gate_blocks_(params["weight_ih"], input_size)
    gate_blocks_(params["weight_hh"], hidden_size)
    if "bias_ih" in params:
        fan_in_normal_(params["bias_ih"], hidden_size)
        truncated_normal_(params["bias_ih"][hidden_size : 2 * hidden_size], std=hidden_size**-0.5, mean=1.0)
        params["bias_hh"].zero_()


def check_init(init: str) -> str:
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    return init


class LSTMCell(Cell):
    """One LSTM step: ``(x, (h, c)) -> (h', (h', c'))``; ``capped_input_gate`` selects the authors' code's
    capped gate instead of the paper's (section 2) plain ``i * j``."""

    state_names = ("h", "c")

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        bias: bool = True,
        capped_input_gate: bool = False,
        init: str = "paper",
    ) -> None:
        super().__init__(input_size, hidden_size, bias)
        self.capped_input_gate = bool(capped_input_gate)
        self.init = check_init(init)

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        return lstm_parameter_shapes(self.input_size, self.hidden_size, self.bias)

    def reset_parameters(self, params: Params) -> None:
        reset_lstm_parameters(params, self.input_size, self.hidden_size, self.init)

    def gates(self, params: Params, x: Tensor, h: Tensor) -> Tensor:
        """Gate pre-activations ``[B, 4H]`` of input ``x`` ``[B, m]`` and recurrent input ``h`` ``[B, H]``."""
        gates = F.linear(x, params["weight_ih"], params.get("bias_ih"))  # [B, 4H]
        return gates + F.linear(h, params["weight_hh"], params.get("bias_hh"))  # [B, 4H]

    def step(self, params: Params, x: Tensor, state: State) -> tuple[Tensor, State]:
        h_prev, c_prev = state
        h, c = lstm_pointwise(self.gates(params, x, h_prev), c_prev, self.capped_input_gate)
        return h, (h, c)

    def extra_repr(self) -> str:
        return super().extra_repr() + (", capped_input_gate=True" if self.capped_input_gate else "")
