"""Hyperparameter search for dynamic evaluation (Krause thesis 4.5 "Hyper-parameter tuning"; Mogrifier
paper appendix A, table 6).

The thesis tunes on the validation set, notes that a small subset of it gives similar settings, and
that the learning rate matters by far the most. The search here is a coordinate search over small
log-spaced grids over table 6's ranges (lr 1e-6..1e-3, decay 1e-6..1e-2, eps 1e-6..1e-2 where table 6 goes
down to 1e-8, segment length 1..20 for words / 50 for characters), with lr up to 1e-2 and decay up to 0.1 added: their scale
depends on how the loss and the statistics are normalised (thesis 4.5, footnote 1), and on a
CPU-budget PTB model with n = 20 the best values sat at table 6's upper ends. For each coordinate in
turn (lr, segment length, lr again, decay, eps) it hill-climbs along that grid from the grid point
nearest the current value, upwards and, if that did not help, downwards, stopping at the first value
that does not improve. Every setting is scored once (results are remembered) on the same validation
prefix. A setting can be ruled out (a score of infinity) when it costs more time than a budget
allows; the time is set by the segment length (one update per segment), so such a search starts
from the longest segment and settles the segment length first (:data:`ORDER_WITH_BUDGET`).

The SGD rules have no RMS normalisation, so their step is in the gradient's units; their learning
rates come from a separate grid (about 0.03 was best on a small PTB word model); ``sgd-momentum`` uses
it too (its best lr shrinks as mu grows, Krause thesis 5.4.1). ``rmsprop``'s step is in units of its
running RMS, like the ``rms`` rules', but with a large ``eps`` it turns into SGD at ``lr / eps``, so its
lr grid reaches SGD's values and its eps grid spans table 5.5's range, 1e-8 to 1 (thesis 5.4.3).
The momentum mu and RMSprop's alpha are not searched: they stay at the start's values.
"""

from __future__ import annotations

import math
from typing import Callable

from .update_rules import Hyperparameters, lr_family, uses_decay, uses_rms

GRIDS: dict[str, tuple] = {
    "lr": (1e-6, 3e-6, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2),
    "lr_sgd": (1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0),
    "decay": (1e-6, 1e-5, 1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1),
    "eps": (1e-6, 1e-4, 1e-3, 1e-2),  # table 6 reaches 1e-8; below 1e-6 a weight with a tiny training RMS takes
    # a huge step (an eps of 1e-8 is still there to be asked for: --eps 1e-8)
    "lr_rmsprop": (1e-6, 3e-6, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0),
    "eps_rmsprop": (1e-8, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1.0),
    "segment_length": (1, 2, 5, 10, 20, 50),
}
ORDER = ("lr", "segment_length", "lr", "decay", "eps")
#: with a time budget: the cost is set by the segment length, so it goes first, from the longest (cheapest)
ORDER_WITH_BUDGET = ("segment_length", "lr", "segment_length", "lr", "decay", "eps")


def grid_for(name: str, hp: Hyperparameters, max_segment_length: int = 20) -> tuple:
    """The grid of coordinate ``name`` for ``hp``'s rule (empty when the rule does not use it)."""
    if name == "lr":
        return {"rms": GRIDS["lr"], "sgd": GRIDS["lr_sgd"], "rmsprop": GRIDS["lr_rmsprop"]}[lr_family(hp.rule)]
    if name == "decay":
        return GRIDS["decay"] if uses_decay(hp.rule) else ()
    if name == "eps":
        return GRIDS["eps"] if uses_rms(hp.rule) else GRIDS["eps_rmsprop"] if hp.rule == "rmsprop" else ()
    return tuple(n for n in GRIDS["segment_length"] if n <= max_segment_length)


def _start_index(grid: tuple, value: float) -> int:
    """The grid point nearest ``value`` on a log scale (the first for ``value <= 0``)."""
    if value <= 0:
        return 0
    return min(range(len(grid)), key=lambda i: abs(math.log(grid[i] / value)))


def coordinate_search(
    score: Callable[[Hyperparameters], tuple[float, dict]],
    start: Hyperparameters,
    order: tuple[str, ...] = ORDER,
    max_segment_length: int = 20,
    log: Callable[[str], None] = print,
) -> tuple[Hyperparameters, list[dict]]:
    """Minimise ``score(hp)``'s objective (validation cross-entropy; ``inf`` rules a setting out) by
    hill-climbing one coordinate at a time. ``score`` returns ``(objective, details)``. Returns the best
    setting and every trial as ``{**hp.as_dict(), "objective": ..., **details}`` in order."""
    seen: dict[Hyperparameters, float] = {}
    trials: list[dict] = []

    def evaluate(hp: Hyperparameters) -> float:
        if hp not in seen:
            seen[hp], details = score(hp)
            trials.append({**hp.as_dict(), "objective": seen[hp], **details})
            log(f"  {hp.label()}: " + ", ".join(f"{k} {v:.4g}" for k, v in details.items()))
        return seen[hp]

    best = start
    for name in order:
        grid = grid_for(name, best, max_segment_length)
        if not grid:
            continue
        i0 = _start_index(grid, getattr(best, name))
        best = best.with_(**{name: grid[i0]}) if evaluate(best.with_(**{name: grid[i0]})) <= evaluate(best) else best
        for direction in (1, -1):
            i, moved = i0 + direction, False
            while 0 <= i < len(grid):
                candidate = best.with_(**{name: grid[i]})
                if evaluate(candidate) >= evaluate(best):
                    break
                best, moved, i = candidate, True, i + direction
            if moved:  # improving upwards: the loss is assumed unimodal along a coordinate
                break
    return best, trials
