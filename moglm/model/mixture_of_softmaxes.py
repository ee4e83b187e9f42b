"""Mixture of softmaxes (Yang et al. 2018), as used for WikiText-2 in the Mogrifier paper (k = 2).

``k`` components ``tanh(W_c h)`` (each of the embedding size), mixture weights ``softmax(W_p h)``; each
component goes through the (tied) output softmax and the mixture is taken in probability space::

    log p(w | h) = logsumexp_i [ log pi_i(h) + log softmax(c_i(h) @ W_out^T + b)_w ]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..cells.initialisation import fan_in_normal_


class MixtureOfSoftmaxes(nn.Module):
    def __init__(
        self, hidden_size: int, embedding_size: int, vocab_size: int, components: int, dropout: float = 0.0
    ) -> None:
        super().__init__()
        if components < 2:
            raise ValueError(f"components must be >= 2 for a mixture, got {components}")
        self.components = components
        self.embedding_size = embedding_size
        self.component = nn.Linear(hidden_size, components * embedding_size)
        self.prior = nn.Linear(hidden_size, components, bias=False)
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        self.dropout = dropout
        self.reset_parameters()

    def reset_parameters(self) -> None:
        fan_in = self.component.in_features
        fan_in_normal_(self.component.weight, fan_in)
        nn.init.zeros_(self.component.bias)
        fan_in_normal_(self.prior.weight, fan_in)
        nn.init.zeros_(self.bias)

    def log_probs(self, h: Tensor, weight: Tensor, factor: float = 1.0) -> Tensor:
        """Log-probabilities ``[N, V]`` of the mixture; ``factor`` scales every component's logits."""
        n = h.shape[0]
        comp = torch.tanh(self.component(h)).view(n * self.components, self.embedding_size)  # [N*k, E]
        comp = F.dropout(comp, self.dropout, self.training)
        logits = F.linear(comp, weight, self.bias)  # [N*k, V]
        if factor != 1.0:
            logits = logits * factor
        log_comp = F.log_softmax(logits, dim=-1).view(n, self.components, -1)  # [N, k, V]
        log_prior = F.log_softmax(self.prior(h), dim=-1)  # [N, k]
        return torch.logsumexp(log_comp + log_prior.unsqueeze(-1), dim=1)  # [N, V]

    def nll(self, h: Tensor, targets: Tensor, weight: Tensor, factor: float = 1.0) -> Tensor:
        return -self.log_probs(h, weight, factor).gather(1, targets.unsqueeze(1)).squeeze(1)  # [N]
