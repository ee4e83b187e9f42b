"""Recovery from surprise (Krause thesis, section 3.5 and figure 3.3; Mogrifier paper, section 4.2).

Score the same text with several models, token by token. The *surprising* tokens are the fraction
(10%) with the largest loss averaged over the models, so that no model's own mistakes define the set.
For each model, the recovery curve is its mean loss k = 1, 2, 3 ... tokens after a surprising token,
next to its mean loss over all tokens: a model that recovers quickly returns to its average within a
few tokens. With dynamic evaluation the same curves show whether adapting speeds the recovery.
"""

from __future__ import annotations

import torch
from torch import Tensor


def surprising_positions(losses: Tensor, fraction: float = 0.1) -> Tensor:
    """Indices (ascending) of the ``fraction`` of positions with the largest mean loss over models.

    ``losses``: ``[M, L]`` per-token losses of M models on the same L tokens."""
    if losses.dim() != 2 or losses.shape[1] == 0:
        raise ValueError(f"losses must be [models, tokens] with tokens > 0, got shape {tuple(losses.shape)}")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    mean = losses.double().mean(0)  # [L]
    count = max(1, int(round(fraction * mean.numel())))
    return torch.topk(mean, count).indices.sort().values  # [count]


def recovery_curve(losses: Tensor, positions: Tensor, horizon: int) -> list[float]:
    """Mean of ``losses`` ``[L]`` at ``positions + k`` for k = 1..``horizon`` (positions whose k-th
    successor lies past the end are left out of that k's mean; NaN when none is left)."""
    losses = losses.double()
    out = []
    for k in range(1, horizon + 1):
        after = positions + k
        after = after[after < losses.numel()]
        out.append(float(losses[after].mean()) if after.numel() else float("nan"))
    return out


def analyse(named_losses: dict[str, Tensor], fraction: float = 0.1, horizon: int = 20) -> dict:
    """Recovery curves of every model (``{name: [L] losses}``, all on the same tokens) after the shared
    surprising positions, and each model's overall mean loss."""
    names = list(named_losses)
    lengths = {named_losses[n].numel() for n in names}
    if len(lengths) != 1:
        raise ValueError(f"the models scored different numbers of tokens: {sorted(lengths)}")
    stacked = torch.stack([named_losses[n].double().flatten() for n in names])  # [M, L]
    positions = surprising_positions(stacked, fraction)
    return {
        "fraction": fraction, "horizon": horizon, "tokens": stacked.shape[1], "surprising": positions.numel(),
        "threshold": float(stacked.mean(0)[positions].min()),
        "models": {n: {"average": float(stacked[i].mean()), "at_surprise": float(stacked[i][positions].mean()),
                       "after": recovery_curve(stacked[i], positions, horizon)} for i, n in enumerate(names)},
    }
