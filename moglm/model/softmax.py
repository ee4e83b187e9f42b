"""The output softmax: an optional bias-free down-projection to the embedding size, then logits against
the (possibly tied) output embedding (docs/method.md, "Embeddings and output")."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class SoftmaxHead(nn.Module):
    """``h`` ``[N, H]`` -> logits ``[N, V]`` via ``dropout(P h) @ W_out^T + b`` (P only when E != H).

    ``W_out`` ``[V, E]`` is passed in by the language model: its own matrix, or the input embedding when
    tied. ``factor`` multiplies the logits (softmax temperature, docs/method.md "Evaluation").
    """

    def __init__(self, hidden_size: int, embedding_size: int, vocab_size: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.projection = nn.Linear(hidden_size, embedding_size, bias=False) if embedding_size != hidden_size else None
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        self.dropout = dropout
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.projection is not None and not self.projection.weight.is_meta:
            nn.init.orthogonal_(self.projection.weight)
        nn.init.zeros_(self.bias)

    def logits(self, h: Tensor, weight: Tensor, factor: float = 1.0) -> Tensor:
        if self.projection is not None:
            h = self.projection(h)  # [N, E]
            if self.training and self.dropout > 0:
                h = F.dropout(h, self.dropout, True)
        logits = F.linear(h, weight, self.bias)  # [N, V]
        return logits if factor == 1.0 else logits.mul_(factor)  # in place: the product's own new tensor

    def log_probs(self, h: Tensor, weight: Tensor, factor: float = 1.0) -> Tensor:
        """Log-probabilities ``[N, V]``."""
        return F.log_softmax(self.logits(h, weight, factor), dim=-1)

    def nll(self, h: Tensor, targets: Tensor, weight: Tensor, factor: float = 1.0) -> Tensor:
        """Negative log-likelihood of ``targets`` ``[N]``, per token ``[N]``."""
        return F.cross_entropy(self.logits(h, weight, factor), targets, reduction="none")
