"""The reference recurrence: a plain Python loop over time steps, obviously right.

Every fast path is tested against this loop (outputs, final states and all gradients, in float64).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..cells.base import Cell, Params, State


def reference_layer(
    cell: Cell, params: Params, xs: Tensor, state: State, h_mask: Tensor | None = None
) -> tuple[Tensor, State]:
    """Run ``cell`` over ``xs`` ``[T, B, m]`` from ``state``; returns ``(outputs [T, B, H], final state)``.

    ``h_mask`` ``[B, H]`` is the variational state-dropout mask: it multiplies h_prev at every step
    (one mask for the whole sequence) before the cell sees it; the state carried forward is unmasked.
    """
    outputs = []
    for x in xs.unbind(0):  # x: [B, m]
        if h_mask is not None:
            state = (state[0] * h_mask, *state[1:])
        h, state = cell.step(params, x, state)  # h: [B, H]
        outputs.append(h)
    return torch.stack(outputs), state  # [T, B, H]
