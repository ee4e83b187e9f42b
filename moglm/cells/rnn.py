"""The Elman RNN step (Krause's thesis, eq. 2.4-2.5) and the multiplicative RNN (Sutskever et al. 2011).

Elman ("vanilla") RNN, in torch.nn.RNN's layout and names (``nonlinearity`` tanh, or relu as torch allows)::

    h = tanh(W_ih x + b_ih + W_hh h_prev + b_hh)

Multiplicative RNN (thesis section 2.4.1, eq. 2.26-2.28): the transition matrix depends on the input,
``W_hh(x) = W_hm diag(W_mx x) W_mh``, computed through the intermediate state m without ever forming it::

    m = (W_mx x) * (W_mh h_prev)                   dim(m) = dim(h)
    h = tanh(W_hx x + W_hm m + b)

The mRNN is the Elman step with m in place of h_prev, exactly as the multiplicative LSTM is the LSTM with
m in place of h_prev (:mod:`moglm.cells.multiplicative_lstm`), and it uses the same names: ``weight_ih``
is W_hx, ``weight_hh`` is W_hm (it acts on m), ``weight_mx`` ``[H, m]`` and ``weight_mh`` ``[H, H]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import Cell, Params, State
from .initialisation import fan_in_normal_, uniform_like_torch_
from .lstm import check_init

NONLINEARITIES = ("tanh", "relu")


def check_nonlinearity(nonlinearity: str) -> str:
    if nonlinearity not in NONLINEARITIES:
        raise ValueError(f"nonlinearity must be one of {NONLINEARITIES}, got {nonlinearity!r}")
    return nonlinearity


def rnn_parameter_shapes(input_size: int, hidden_size: int, bias: bool, blocks: int = 1) -> dict[str, tuple[int, ...]]:
    """torch.nn.RNNCell's parameters; ``blocks`` > 1 gives fused gate layouts (3 for torch.nn.GRU)."""
    shapes = {"weight_ih": (blocks * hidden_size, input_size), "weight_hh": (blocks * hidden_size, hidden_size)}
    if bias:
        shapes.update(bias_ih=(blocks * hidden_size,), bias_hh=(blocks * hidden_size,))
    return shapes


def reset_rnn_parameters(params: Params, input_size: int, hidden_size: int, init: str) -> None:
    """``paper``: the LSTM scheme without a forget gate: weights truncated normal with std sqrt(1/fan_in)
    (``weight_hh`` at fan-in H whatever its number of rows), ``bias_ih`` random at the hidden scale,
    ``bias_hh`` zero. ``torch``: torch.nn.RNN's U(-1/sqrt(H), 1/sqrt(H)) for everything."""
    if init == "torch":
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            if name in params:
                uniform_like_torch_(params[name], hidden_size)
        return
    fan_in_normal_(params["weight_ih"], input_size)
    fan_in_normal_(params["weight_hh"], hidden_size)
    if "bias_ih" in params:
        fan_in_normal_(params["bias_ih"], hidden_size)
        params["bias_hh"].zero_()


def reset_matrix(tensor: Tensor, fan_in: int, hidden_size: int, init: str) -> None:
    """One extra weight matrix: truncated normal std sqrt(1/fan_in) (``paper``) or torch's uniform."""
    if init == "torch":
        uniform_like_torch_(tensor, hidden_size)
    else:
        fan_in_normal_(tensor, fan_in)


class RNNCell(Cell):
    """Elman step ``(x, (h,)) -> (h', (h',))``, torch.nn.RNNCell's computation and parameter names.

    Subclasses change what multiplies ``weight_hh`` (:meth:`recurrent_input`) or mogrify the inputs;
    :meth:`update` is the shared ``nonlinearity(W_ih x + b_ih + W_hh r + b_hh)``.
    """

    def __init__(
        self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh", init: str = "paper"
    ) -> None:
        super().__init__(input_size, hidden_size, bias)
        self.nonlinearity = check_nonlinearity(nonlinearity)
        self.init = check_init(init)

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        return rnn_parameter_shapes(self.input_size, self.hidden_size, self.bias)

    def reset_parameters(self, params: Params) -> None:
        reset_rnn_parameters(params, self.input_size, self.hidden_size, self.init)

    def update(self, params: Params, x: Tensor, r: Tensor) -> Tensor:
        """``nonlinearity(W_ih x + b_ih + W_hh r + b_hh)``, ``[B, H]``, for recurrent input ``r``."""
        pre = F.linear(x, params["weight_ih"], params.get("bias_ih"))  # [B, H]
        pre = pre + F.linear(r, params["weight_hh"], params.get("bias_hh"))  # [B, H]
        return self.activate(pre)

    def activate(self, pre: Tensor) -> Tensor:
        """The nonlinearity, tanh or relu."""
        return torch.tanh(pre) if self.nonlinearity == "tanh" else torch.relu(pre)

    def recurrent_input(self, params: Params, x: Tensor, h: Tensor) -> Tensor:
        """What ``weight_hh`` multiplies: h_prev itself in the Elman RNN."""
        return h

    def step(self, params: Params, x: Tensor, state: State) -> tuple[Tensor, State]:
        (h_prev,) = state
        h = self.update(params, x, self.recurrent_input(params, x, h_prev))  # [B, H]
        return h, (h,)

    def extra_repr(self) -> str:
        return super().extra_repr() + ("" if self.nonlinearity == "tanh" else f", nonlinearity={self.nonlinearity!r}")


class MultiplicativeRNNCell(RNNCell):
    """Sutskever et al.'s mRNN (thesis eq. 2.27-2.28): the Elman step on ``m = (W_mx x) * (W_mh h_prev)``."""

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes = super().parameter_shapes()
        shapes.update(weight_mx=(self.hidden_size, self.input_size), weight_mh=(self.hidden_size, self.hidden_size))
        return shapes

    def reset_parameters(self, params: Params) -> None:
        super().reset_parameters(params)
        reset_matrix(params["weight_mx"], self.input_size, self.hidden_size, self.init)
        reset_matrix(params["weight_mh"], self.hidden_size, self.hidden_size, self.init)

    def recurrent_input(self, params: Params, x: Tensor, h: Tensor) -> Tensor:
        """``m = (W_mx x) * (W_mh h)``, ``[B, H]``: ``W_hm m`` is ``W_hm diag(W_mx x) W_mh h`` (eq. 2.26)."""
        return F.linear(x, params["weight_mx"]) * F.linear(h, params["weight_mh"])  # [B, H]
