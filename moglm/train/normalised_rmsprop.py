"""RMSprop with normalised updates (Krause thesis 3.5.1, eq. 3.14), the optimiser of the thesis's first mLSTM
experiments ("mLSTM (RMSprop)" in its tables).

RMSprop's update direction ``v* = g / (sqrt(ms) + eps)``, with ``ms <- alpha ms + (1 - alpha) g^2`` per
weight, is rescaled to a fixed length ``l`` over all the parameters together (eq. 3.14):

    v = l / sqrt(v*^T v*) * v*,        theta <- theta - v

``l`` is the learning rate (the engine's schedule decays it; the thesis decayed it exponentially). The
thesis notes that this equals gradient-norm clipping with an infinite learning rate and a vanishing
threshold. ``alpha`` and ``eps`` are the run config's ``adam_beta2`` and ``adam_eps``: Adam's second-moment
average is RMSprop's.
"""

from __future__ import annotations

import math

import torch


class NormalisedRMSprop(torch.optim.Optimizer):
    """Eq. 3.14 (module docstring): the update over every parameter of every group has length ``lr``."""

    def __init__(self, params, lr: float, alpha: float = 0.999, eps: float = 1e-8) -> None:
        if not lr > 0 or not 0 < alpha < 1 or not eps > 0:
            raise ValueError(f"normalised RMSprop needs lr > 0, 0 < alpha < 1 and eps > 0, got {lr}, {alpha}, {eps}")
        super().__init__(params, {"lr": lr, "alpha": alpha, "eps": eps})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        directions = []
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                square_avg = self.state[p].setdefault("square_avg", torch.zeros_like(p))
                square_avg.mul_(group["alpha"]).addcmul_(p.grad, p.grad, value=1 - group["alpha"])
                directions.append((p, group, p.grad / (square_avg.sqrt() + group["eps"])))  # v*
        length = math.sqrt(sum(float((d * d).sum()) for _, _, d in directions))  # sqrt(v*^T v*)
        if length > 0:
            for p, group, d in directions:
                p.sub_(d, alpha=group["lr"] / length)
        return loss
