"""The NADE output layer (Krause thesis 2.6.1, eq. 2.58-2.63; Larochelle and Murray 2011): an exact
autoregressive distribution over a binary frame ``x`` of ``D`` units (here the piano's 88 keys, lowest first).

    P(x) = prod_n P(x_n | x_<n)                                  (eq. 2.58)
    a_n  = b_h + sum_{m < n} W[:, m] x_m                           (eq. 2.60-2.61; a_1 = b_h)
    h_n  = act(a_n)                                                (eq. 2.62: relu; sigmoid as in Boulanger-
                                                                    Lewandowski et al. 2012, an option)
    P(x_n = 1 | x_<n) = sigmoid(V[n] . h_n + b_y[n])               (eq. 2.59, 2.63)

In the RNN-NADE (eq. 2.64-2.65) the biases ``b_h`` and ``b_y`` come from the recurrent state at every frame, so
they are arguments here, one per frame, and the NADE owns only ``W`` ``[H, D]`` and ``V`` ``[D, H]``.

:meth:`NADE.log_prob` computes every conditional at once (an exclusive cumulative sum over the units);
:meth:`NADE.log_prob_reference` is its twin, the plain loop over ``n`` of eq. 2.61. The log-likelihood is exact:
the tests enumerate all ``2^D`` frames of a small NADE and check that the probabilities sum to one.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ACTIVATIONS = ("sigmoid", "relu")


class NADE(nn.Module):
    """``D`` visible units, ``H`` hidden units; ``activation`` ``sigmoid`` or ``relu``. ``dropout`` on the hidden
    units: one mask per frame, shared by the frame's ``D`` conditionals (thesis 4.8: "dropout was also applied to
    NADE units separately at each timestep")."""

    def __init__(self, visible: int, hidden: int, activation: str = "relu", dropout: float = 0.0) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"NADE activation must be one of {ACTIVATIONS}, got {activation!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"NADE dropout must be in [0, 1), got {dropout}")
        self.visible, self.hidden, self.activation, self.dropout = visible, hidden, activation, dropout
        self.weight_in = nn.Parameter(torch.empty(hidden, visible))  # W: column m reads x_m
        self.weight_out = nn.Parameter(torch.empty(visible, hidden))  # V: row n predicts x_n
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.hidden)
        nn.init.uniform_(self.weight_in, -bound, bound)
        nn.init.uniform_(self.weight_out, -bound, bound)

    def _act(self, a: Tensor) -> Tensor:
        return torch.sigmoid(a) if self.activation == "sigmoid" else torch.relu(a)

    def _mask(self, like: Tensor) -> Tensor | None:
        """One inverted-dropout mask per frame ``[N, 1, H]`` (``None`` in eval mode or at rate 0)."""
        if not (self.training and self.dropout > 0):
            return None
        keep = 1.0 - self.dropout
        return like.new_empty(like.shape[0], 1, self.hidden).bernoulli_(keep).div_(keep)

    def logits(self, x: Tensor, b_h: Tensor, b_y: Tensor) -> Tensor:
        """The logit of every conditional ``P(x_n = 1 | x_<n)``: ``[..., D]`` from frames ``x`` ``[..., D]`` and
        biases ``b_h`` ``[..., H]``, ``b_y`` ``[..., D]`` (all conditionals at once)."""
        lead = x.shape[:-1]
        x, b_h, b_y = x.reshape(-1, self.visible), b_h.reshape(-1, self.hidden), b_y.reshape(-1, self.visible)
        contributions = x.unsqueeze(-1) * self.weight_in.t()  # [N, D, H]: x_m W[:, m]
        before = contributions.cumsum(1) - contributions  # [N, D, H]: sum over m < n (eq. 2.60)
        h = self._act(b_h.unsqueeze(1) + before)  # [N, D, H] (eq. 2.62)
        mask = self._mask(h)
        if mask is not None:
            h = h * mask
        out = (h * self.weight_out).sum(-1) + b_y  # [N, D] (eq. 2.63)
        return out.view(*lead, self.visible)

    def log_prob(self, x: Tensor, b_h: Tensor, b_y: Tensor, factor: float = 1.0) -> Tensor:
        """``log P(x)`` ``[...]`` of binary frames ``x`` ``[..., D]`` (eq. 2.58); ``factor`` multiplies every
        logit (an inverse temperature)."""
        logits = self.logits(x, b_h, b_y) * factor  # [..., D]
        return -F.binary_cross_entropy_with_logits(logits, x, reduction="none").sum(-1)

    def log_prob_reference(self, x: Tensor, b_h: Tensor, b_y: Tensor, factor: float = 1.0) -> Tensor:
        """:meth:`log_prob` as the plain loop over the units of eq. 2.61 (no dropout): the reference twin."""
        a = b_h.clone()  # [..., H]: a_1 = b_h
        total = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)  # [...]
        for n in range(self.visible):
            logit = ((self._act(a) * self.weight_out[n]).sum(-1) + b_y[..., n]) * factor  # [...]
            total = total + x[..., n] * F.logsigmoid(logit) + (1 - x[..., n]) * F.logsigmoid(-logit)
            a = a + x[..., n, None] * self.weight_in[:, n]  # eq. 2.61
        return total

    @torch.no_grad()
    def sample(self, b_h: Tensor, b_y: Tensor, generator: torch.Generator | None = None,
               temperature: float = 1.0) -> Tensor:
        """Draw frames ``[..., D]`` unit by unit, each from its conditional given the units drawn before it."""
        a = b_h.clone()  # [..., H]
        x = torch.zeros(*b_h.shape[:-1], self.visible, dtype=b_h.dtype, device=b_h.device)  # [..., D]
        for n in range(self.visible):
            logit = ((self._act(a) * self.weight_out[n]).sum(-1) + b_y[..., n]) / temperature  # [...]
            u = torch.rand(logit.shape, generator=generator, dtype=logit.dtype).to(logit.device)
            x[..., n] = (u < torch.sigmoid(logit)).to(x.dtype)
            a = a + x[..., n, None] * self.weight_in[:, n]
        return x
