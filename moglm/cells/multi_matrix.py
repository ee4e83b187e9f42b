"""Multi-matrix RNN and LSTM (mmRNN, mmLSTM; the student report, sections 4.3-4.4).

K shared transition matrices per gate; a softmax key vector, itself part of the recurrent state, picks an
input-dependent mixture of them at every step (report eq. 6-8 for the mmRNN)::

    key   = softmax(W_key [key_prev; h_prev; x] + b_key)          W_key: [K, K + H + m]   (report: W_proj)
    W_hh(t) = sum_j key_j W_j                                      W_j: [H, H], j = 1..K
    h     = tanh(W_hh(t) h_prev + b_hh + W_ih x + b_ih)

The mmLSTM (eq. 9-22) has one key vector and K matrices per gate (i, f, j, o in torch.nn.LSTM's order;
the report's c-hat is j), each key conditioned on its own previous key, then an ordinary LSTM update
from the mixed recurrent pre-activations. With K = 1 the key is always 1 and the cells are exactly the
Elman RNN / LSTM (same parameter names: ``weight_hh`` stacks the K matrices).

Implementation (report 5.3: what made these models usable): ``W_hh(t) h`` is never formed as a per-example
``[B, H, H]`` matrix. ``sum_j key_j (W_j h)`` is ONE matrix product of h against the K matrices stacked
(``weight_hh`` ``[K*G*H, H]``, key-major: block j is a whole ``[G*H, H]`` recurrent matrix), then a
key-weighted sum over K of the ``[B, K, G, H]`` result (G = 1 gate for the mmRNN, 4 for the mmLSTM).

State: ``(h, key)`` for the mmRNN (key ``[B, K]``) and ``(h, c, key)`` for the mmLSTM (key ``[B, 4K]``, the
gates' key vectors side by side, i|f|j|o). The report initialises the key to equal weights 1/K. A key row
that is all zero (the zero state of ``hx=None``, or a row a training loop reset to zero) is read as that
uniform key, so every generic zero state means the report's initial key. Keys the cell produces are
softmax outputs and never zero. State dropout masks h only; the key is carried untouched.

The report's W_proj has no bias; ``bias=True`` adds ``b_key``, zero under ``init="paper"``. Every W_j is
initialised like the plain cell's W_hh, so at the uniform key W_hh(t) starts with about 1/sqrt(K) of its scale.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import Params, State
from .initialisation import uniform_like_torch_
from .lstm import LSTMCell, lstm_pointwise
from .rnn import RNNCell, reset_matrix


def check_num_matrices(num_matrices: int) -> int:
    if not isinstance(num_matrices, int) or isinstance(num_matrices, bool) or num_matrices < 1:
        raise ValueError(f"num_matrices must be an integer >= 1, got {num_matrices!r}")
    return num_matrices


def next_key(params: Params, key_prev: Tensor, h: Tensor, x: Tensor, num_matrices: int) -> Tensor:
    """``softmax(W_key^g [key_prev^g; h; x] + b_key^g)`` for every gate g, ``[B, G, K]``, from ``key_prev``
    ``[B, G*K]`` (eq. 6, 9, 11, 13, 15)."""
    k = num_matrices
    batch = h.shape[0]
    gates = key_prev.shape[1] // k
    key_prev = key_prev.view(batch, gates, k)  # [B, G, K] (sizes spelled out: -1 is ambiguous for B = 0)
    unset = key_prev.abs().sum(-1, keepdim=True) == 0  # [B, G, 1]: a zero key stands for the uniform one
    key_prev = torch.where(unset, torch.full_like(key_prev, 1.0 / k), key_prev)  # [B, G, K]
    weight = params["weight_key"]  # [G*K, K + H + m]
    pre = F.linear(h, weight[:, k : k + h.shape[1]], params.get("bias_key"))  # [B, G*K]
    pre = pre + F.linear(x, weight[:, k + h.shape[1] :])  # [B, G*K]
    own = torch.einsum("gjl,bgl->bgj", weight[:, :k].reshape(gates, k, k), key_prev)  # [B, G, K], gate g's own key
    return torch.softmax(pre.view(batch, gates, k) + own, dim=-1)  # [B, G, K]


def mixed_transition(weight_hh: Tensor, h: Tensor, key: Tensor) -> Tensor:
    """``sum_j key[:, g, j] * (W_j h)`` for every gate g, ``[B, G*H]``, from ``weight_hh`` ``[K*G*H, H]`` (key-major)
    and ``key`` ``[B, G, K]``: one GEMM against all K*G matrices, no per-example ``[B, H, H]`` matrix."""
    batch, gates, k = key.shape
    hidden = weight_hh.shape[0] // (k * gates)
    products = F.linear(h, weight_hh).view(batch, k, gates, hidden)  # [B, K, G, H]
    return torch.einsum("bkgh,bgk->bgh", products, key).reshape(batch, gates * hidden)  # [B, G*H]


def multi_matrix_pre_activations(
    params: Params, x: Tensor, h_prev: Tensor, key_prev: Tensor, num_matrices: int
) -> tuple[Tensor, Tensor]:
    """``(W_ih x + b_ih + W_hh(t) h_prev + b_hh [B, G*H], new key [B, G*K])``: eq. 6-7 (mmRNN), 9-16 (mmLSTM)."""
    key = next_key(params, key_prev, h_prev, x, num_matrices)  # [B, G, K]
    pre = F.linear(x, params["weight_ih"], params.get("bias_ih"))  # [B, G*H]
    pre = pre + mixed_transition(params["weight_hh"], h_prev, key)  # [B, G*H]
    if "bias_hh" in params:
        pre = pre + params["bias_hh"]
    return pre, key.flatten(1)


class MultiMatrixTransitions:
    """Mixin turning a cell's ``weight_hh`` into K stacked matrices per gate chosen by a key: the shapes, the
    initialisation and the repr. The cell class sets :attr:`gates` (G) and calls :meth:`_init_matrices`."""

    gates = 1

    def _init_matrices(self, num_matrices: int) -> None:
        self.num_matrices = check_num_matrices(num_matrices)

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """The plain cell's shapes with ``weight_hh`` ``[K*G*H, H]`` (key-major), plus ``weight_key``
        ``[G*K, K + H + m]`` (columns: previous key | h_prev | x; rows gate-major) and ``bias_key`` ``[G*K]``."""
        k, g, n = self.num_matrices, self.gates, self.hidden_size
        shapes = dict(super().parameter_shapes(), weight_hh=(k * g * n, n), weight_key=(g * k, k + n + self.input_size))
        if self.bias:
            shapes["bias_key"] = (g * k,)
        return shapes

    def reset_parameters(self, params: Params) -> None:
        """The plain cell's scheme for every W_j (std sqrt(1/H) under ``paper``); ``weight_key`` truncated normal
        std sqrt(1/fan_in) and ``bias_key`` zero (``paper``) or torch's uniform."""
        super().reset_parameters(params)
        weight = params["weight_key"]
        reset_matrix(weight, weight.shape[1], self.hidden_size, self.init)
        if "bias_key" in params:
            if self.init == "torch":
                uniform_like_torch_(params["bias_key"], self.hidden_size)
            else:
                params["bias_key"].zero_()

    def extra_repr(self) -> str:
        return super().extra_repr() + f", num_matrices={self.num_matrices}"


class MultiMatrixRNNCell(MultiMatrixTransitions, RNNCell):
    """mmRNN step ``(x, (h, key)) -> (h', (h', key'))`` (report eq. 6-8); ``num_matrices`` is K."""

    state_names = ("h", "key")
    gates = 1

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        bias: bool = True,
        num_matrices: int = 4,
        nonlinearity: str = "tanh",
        init: str = "paper",
    ) -> None:
        super().__init__(input_size, hidden_size, bias, nonlinearity, init)
        self._init_matrices(num_matrices)

    def state_sizes(self) -> tuple[int, ...]:
        return (self.hidden_size, self.num_matrices)

    def step(self, params: Params, x: Tensor, state: State) -> tuple[Tensor, State]:
        h_prev, key_prev = state
        pre, key = multi_matrix_pre_activations(params, x, h_prev, key_prev, self.num_matrices)  # [B, H], [B, K]
        h = self.activate(pre)  # [B, H]  (eq. 8)
        return h, (h, key)


class MultiMatrixLSTMCell(MultiMatrixTransitions, LSTMCell):
    """mmLSTM step ``(x, (h, c, key)) -> (h', (h', c', key'))`` (report eq. 9-22); K = ``num_matrices`` per gate.
    Under ``init="paper"`` every W_j is initialised like an LSTM W_hh and the forget bias has mean 1."""

    state_names = ("h", "c", "key")
    reference_only = True  # an LSTM by inheritance, but no fused window fits its K matrices: the loop is its path
    gates = 4

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        bias: bool = True,
        num_matrices: int = 4,
        capped_input_gate: bool = False,
        init: str = "paper",
    ) -> None:
        super().__init__(input_size, hidden_size, bias, capped_input_gate, init)
        self._init_matrices(num_matrices)

    def state_sizes(self) -> tuple[int, ...]:
        return (self.hidden_size, self.hidden_size, 4 * self.num_matrices)

    def step(self, params: Params, x: Tensor, state: State) -> tuple[Tensor, State]:
        h_prev, c_prev, key_prev = state
        gates, key = multi_matrix_pre_activations(params, x, h_prev, key_prev, self.num_matrices)  # [B, 4H], [B, 4K]
        h, c = lstm_pointwise(gates, c_prev, self.capped_input_gate)  # [B, H] each  (eq. 17-22)
        return h, (h, c, key)
