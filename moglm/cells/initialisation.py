"""Initialisation schemes of the original experiments (docs/method.md, "Initialisation").

* Weight blocks: truncated normal (cut at two standard deviations) with std ``sqrt(1/fan_in)``.
* Low-rank factors of rank k: both factors truncated normal with std ``(1/(fan_in*k))**0.25``,
  so that their product has variance about ``1/fan_in``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def truncated_normal_(tensor: Tensor, std: float, mean: float = 0.0) -> Tensor:
    """Fill ``tensor`` from N(mean, std^2) truncated to mean +- 2 std (TensorFlow's ``truncated_normal``)."""
    return torch.nn.init.trunc_normal_(tensor, mean=mean, std=std, a=mean - 2 * std, b=mean + 2 * std)


def fan_in_normal_(tensor: Tensor, fan_in: int) -> Tensor:
    """Truncated normal with std ``sqrt(1/fan_in)``."""
    return truncated_normal_(tensor, std=math.sqrt(1.0 / fan_in))


def low_rank_factor_(tensor: Tensor, fan_in: int, rank: int) -> Tensor:
    """One factor of a rank-``rank`` product: std ``(1/(fan_in*rank))**(1/4)``."""
    return truncated_normal_(tensor, std=(1.0 / (fan_in * rank)) ** 0.25)


def gate_blocks_(weight: Tensor, fan_in: int, blocks: int = 4) -> Tensor:
    """Initialise a fused ``[blocks*H, fan_in]`` gate matrix one block at a time (each std sqrt(1/fan_in))."""
    for block in weight.chunk(blocks, dim=0):
        fan_in_normal_(block, fan_in)
    return weight


def uniform_like_torch_(tensor: Tensor, hidden_size: int) -> Tensor:
    """torch.nn.LSTM's default: U(-1/sqrt(hidden), 1/sqrt(hidden))."""
    bound = 1.0 / math.sqrt(hidden_size)
    return torch.nn.init.uniform_(tensor, -bound, bound)
