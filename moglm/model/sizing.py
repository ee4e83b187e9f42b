"""Sizing by parameter budget (the paper's protocol: models are compared at equal parameter count).

Given ``num_params``, the hidden size is the largest one whose model fits the budget. Candidate models
are built on the ``meta`` device, so counting costs no memory and no initialisation.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ..errors import MoglmError


def count_on_meta(build: Callable[[int], nn.Module], hidden_size: int) -> int:
    """Parameter count of ``build(hidden_size)``, built on the meta device."""
    with torch.device("meta"):
        model = build(hidden_size)
    return sum(p.numel() for p in model.parameters())


def largest_hidden_size(num_params: int, build: Callable[[int], nn.Module], maximum: int = 1 << 16) -> int:
    """The largest ``hidden_size`` with ``count(build(hidden_size)) <= num_params``.

    Small sizes where ``build`` raises ``ValueError`` (e.g. a mogrifier rank larger than the sizes) are
    invalid; above the smallest valid size the count grows with the hidden size.
    """

    def valid(h: int) -> bool:
        try:
            count_on_meta(build, h)
        except ValueError:
            return False
        return True

    # the smallest valid size: double until valid, then bisect down
    hi = 1
    while not valid(hi):
        if hi >= maximum:
            raise MoglmError("no hidden size gives a valid model")
        hi = min(2 * hi, maximum)
    lo = hi // 2  # invalid (or 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if valid(mid) else (mid, hi)
    smallest = hi
    if count_on_meta(build, smallest) > num_params:
        raise MoglmError(f"model.num_params = {num_params:,} is too small for any hidden size of this model")
    lo, hi = smallest, smallest  # fits(lo); find an upper bound that does not fit
    while count_on_meta(build, hi) <= num_params:
        if hi >= maximum:
            return maximum
        lo, hi = hi, min(2 * hi, maximum)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if count_on_meta(build, mid) <= num_params else (lo, mid)
    return lo
