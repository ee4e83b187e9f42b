"""The Dyck-RNN (the student report, section 4.2, eq. 3-5): a hidden state that works as a stack.

Two fixed shift matrices, W1 with ones on the subdiagonal (shift down: push) and W2 with ones on the
superdiagonal (shift up: pop), are mixed by a scalar push/pop gate computed from the input::

    g = sigmoid(W_gate x + b_gate)                  W_gate: [1, m]   (report: W_proj), g: [B, 1]
    h = (g W1 + (1 - g) W2) h_prev + g * (W_ih x + b_ih)      W_ih: [H, m]   (report: W_hx)

with no nonlinearity. Index 0 is the top of the stack: W1 h = (0, h_0, ..., h_{H-2}) frees it for the
pushed value, W2 h = (h_1, ..., h_{H-1}, 0) pops it. The report has no biases; with ``bias=True`` the
two biases start at zero (``init="paper"``), so the cell starts as the report's equations.

W1 and W2 are never materialised: ``W1 h`` and ``W2 h`` are a zero-padded slice of h (:func:`shift_down`,
:func:`shift_up`), exact and free. They are not parameters at all (neither frozen Parameters nor buffers):
they are fixed by the hidden size, so storing them would only add H^2 constants to every state dict,
parameter count and weight-decay sum. :func:`shift_matrices` builds them explicitly, for tests and analysis.

The report feeds brackets through a fixed 1-d embedding (:func:`bracket_embedding_table`) with H = m for
depth-m Dyck-k; its variant (section 6.2) learns a 2-d embedding and uses H = 2m.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import Cell, Params, State
from .initialisation import fan_in_normal_, uniform_like_torch_
from .lstm import check_init


def shift_down(h: Tensor) -> Tensor:
    """``W1 h`` (ones on the subdiagonal): ``(0, h_0, ..., h_{H-2})``, the push shift. ``[..., H]``."""
    return F.pad(h[..., :-1], (1, 0))


def shift_up(h: Tensor) -> Tensor:
    """``W2 h`` (ones on the superdiagonal): ``(h_1, ..., h_{H-1}, 0)``, the pop shift. ``[..., H]``."""
    return F.pad(h[..., 1:], (0, 1))


def shift_matrices(
    hidden_size: int, device: torch.device | str | None = None, dtype: torch.dtype | None = None
) -> tuple[Tensor, Tensor]:
    """The explicit ``(W1, W2)``, each ``[H, H]``: ones on the sub- / superdiagonal."""
    ones = torch.ones(hidden_size - 1, device=device, dtype=dtype)
    return torch.diag(ones, -1), torch.diag(ones, 1)


def bracket_embedding_table(num_types: int, dtype: torch.dtype | None = None) -> Tensor:
    """A hand-set 1-d embedding ``[2k, 1]`` of k bracket types: rows 0..k-1 are the opening brackets, valued
    1..k (positive: push, and the value names the type), rows k..2k-1 the closing ones, valued -1..-k (pop)."""
    if not isinstance(num_types, int) or isinstance(num_types, bool) or num_types < 1:
        raise ValueError(f"num_types must be an integer >= 1, got {num_types!r}")
    values = torch.arange(1, num_types + 1, dtype=dtype or torch.get_default_dtype())
    return torch.cat([values, -values]).unsqueeze(1)  # [2k, 1]


class DyckRNNCell(Cell):
    """Dyck-RNN step ``(x, (h,)) -> (h', (h',))``: a gated push/pop of a stack held in h."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, init: str = "paper") -> None:
        super().__init__(input_size, hidden_size, bias)
        self.init = check_init(init)

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes = {"weight_ih": (self.hidden_size, self.input_size), "weight_gate": (1, self.input_size)}
        if self.bias:
            shapes.update(bias_ih=(self.hidden_size,), bias_gate=(1,))
        return shapes

    def reset_parameters(self, params: Params) -> None:
        """``paper``: weights truncated normal std sqrt(1/m), biases zero; ``torch``: U(-1/sqrt(H), 1/sqrt(H))."""
        for name, p in params.items():
            if self.init == "torch":
                uniform_like_torch_(p, self.hidden_size)
            elif name.startswith("bias"):
                p.zero_()
            else:
                fan_in_normal_(p, self.input_size)

    def gate(self, params: Params, x: Tensor) -> Tensor:
        """The push probability ``g = sigmoid(W_gate x + b_gate)``, ``[B, 1]`` (eq. 3)."""
        return torch.sigmoid(F.linear(x, params["weight_gate"], params.get("bias_gate")))  # [B, 1]

    def step(self, params: Params, x: Tensor, state: State) -> tuple[Tensor, State]:
        (h_prev,) = state
        g = self.gate(params, x)  # [B, 1]
        pushed = shift_down(h_prev) + F.linear(x, params["weight_ih"], params.get("bias_ih"))  # [B, H]
        h = g * pushed + (1.0 - g) * shift_up(h_prev)  # [B, H]  (eq. 4-5)
        return h, (h,)
