"""WCPA: worst-case long-distance prediction accuracy on bounded Dyck-k (the student report, section 5.2,
after Hewitt et al. 2020, "RNNs can generate bounded hierarchical languages with optimal memory").

A *prediction* is made wherever a closing bracket is the correct continuation: before every closing
bracket of the data (``positions="closing"``, the report's closing-bracket prediction task) or, as in
Hewitt et al.'s evaluation, before every token read with a non-empty stack (``positions="open_stack"``:
there the only closing bracket that may come next is the top's). A prediction is *correct* when at least
80% of the probability mass is on the correct bracket, ``p(correct) >= 0.8``: the report's definition
(section 5.2), the default (``normalised=False``). ``normalised=True`` judges only the choice among closing
brackets, ``p(correct) / sum_c p(c) >= 0.8``, as Hewitt et al. do for a language model that must also
spend mass on opening brackets and the end; a model that predicts closing brackets only, like the
report's Dyck-RNN, has ``sum_c p(c) = 1``, so the two agree for it.

The *distance* of a prediction is the number of tokens from the opening bracket it must close to the
token predicted: ``j - i`` for the bracket opened at position i and a prediction of position j (1 for
``()``, 3 for the outer pair of ``(())``). Distances are grouped into buckets, by default powers of two
(``1``, ``2-3``, ``4-7``, ...); accuracy is computed per bucket and WCPA is the worst bucket's accuracy,
over buckets with at least ``min_count`` (10) predictions: every bucket is reported, but one or two stray
predictions at the longest distance of a test set are not a bucket to take a worst case over.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

THRESHOLD = 0.8
MIN_COUNT = 10
POSITIONS = ("closing", "open_stack")


def closing_predictions(
    sequence: Sequence[int], num_types: int, positions: str = "closing"
) -> list[tuple[int, int, int]]:
    """The predictions WCPA judges in one bracket sequence (ids ``0..k-1`` open, ``k..2k-1`` the matching close):
    ``(position predicted, correct closing type 0..k-1, distance)`` triples."""
    if positions not in POSITIONS:
        raise ValueError(f"positions must be one of {POSITIONS}, got {positions!r}")
    stack: list[tuple[int, int]] = []  # (type, position opened)
    out = []
    for j, token in enumerate(sequence):
        is_close = token >= num_types
        if stack and (is_close or positions == "open_stack"):
            kind, opened = stack[-1]
            out.append((j, kind, j - opened))
        if not is_close:
            stack.append((token, j))
        elif not stack or stack.pop()[0] != token - num_types:
            raise ValueError(f"not a well-nested bracket sequence: unexpected close at position {j}")
    return out


def power_of_two_edges(max_distance: int) -> list[int]:
    """Bucket lower edges ``1, 2, 4, ...`` covering distances up to ``max_distance``."""
    edges = [1]
    while edges[-1] * 2 <= max_distance:
        edges.append(edges[-1] * 2)
    return edges


@dataclass
class WCPAResult:
    """Per-bucket counts and accuracies and their worst case (``None`` when nothing was judged); ``accuracy``
    over all predictions; ``xent`` the mean of ``-log p(correct closing bracket)``, normalised as WCPA's."""

    wcpa: float | None
    accuracy: float | None
    xent: float | None
    predictions: int
    buckets: list[dict]
    threshold: float
    min_count: int = MIN_COUNT

    def as_dict(self) -> dict:
        return {"wcpa": self.wcpa, "accuracy": self.accuracy, "xent": self.xent, "predictions": self.predictions,
                "threshold": self.threshold, "min_count": self.min_count, "buckets": self.buckets}


def wcpa_from_probabilities(
    probabilities: Tensor | np.ndarray,
    distances: Tensor | np.ndarray,
    edges: Sequence[int] | None = None,
    threshold: float = THRESHOLD,
    min_count: int = MIN_COUNT,
) -> WCPAResult:
    """WCPA of predictions whose (closing-normalised) probability of the correct bracket is ``probabilities``
    ``[N]`` at ``distances`` ``[N]``. ``edges``: ascending bucket lower edges (default powers of two); a bucket
    runs up to the next edge. Buckets with fewer than ``min_count`` predictions are listed but not in the worst case."""
    p = np.asarray(probabilities, dtype=np.float64)  # [N]
    d = np.asarray(distances, dtype=np.int64)  # [N]
    if p.shape != d.shape:
        raise ValueError(f"probabilities and distances must have one shape, got {p.shape} and {d.shape}")
    if p.size == 0:
        return WCPAResult(None, None, None, 0, [], threshold, min_count)
    edges = list(edges) if edges is not None else power_of_two_edges(int(d.max()))
    correct = p >= threshold  # [N]
    which = np.searchsorted(np.asarray(edges), d, side="right") - 1  # [N], -1 below the first edge
    buckets = []
    for b, lo in enumerate(edges):
        hi = edges[b + 1] - 1 if b + 1 < len(edges) else int(max(d.max(), lo))
        members = which == b
        n = int(members.sum())
        if n:
            hits = int(correct[members].sum())
            buckets.append({"distance": f"{lo}" if lo == hi else f"{lo}-{hi}", "min": lo, "max": hi,
                            "count": n, "correct": hits, "accuracy": hits / n})
    counted = [b["accuracy"] for b in buckets if b["count"] >= min_count]
    worst = min(counted) if counted else None
    xent = float(-np.log(np.clip(p, 1e-30, None)).mean())
    return WCPAResult(worst, float(correct.mean()), xent, int(p.size), buckets, threshold, min_count)


@torch.no_grad()
def closing_probabilities(log_probs: Tensor, close_ids: Tensor, positions: Tensor, types: Tensor,
                          normalised: bool = False) -> Tensor:
    """The probability of the correct closing bracket (``normalised``: among closing brackets only).

    ``log_probs`` ``[T, B, V]`` next-token log-probabilities; ``close_ids`` ``[k]`` the vocabulary ids of the
    closing brackets by type; ``positions`` ``[N, 2]`` (time, row) of each prediction; ``types`` ``[N]`` its
    correct closing type. Returns ``[N]``."""
    picked = log_probs[positions[:, 0], positions[:, 1]]  # [N, V]
    closing = picked[:, close_ids]  # [N, k]
    if normalised:
        closing = closing.log_softmax(-1)  # [N, k], renormalised over closing brackets
    return closing.gather(1, types[:, None]).squeeze(1).exp()  # [N]


def prediction_batch(
    sequences: Sequence[Sequence[int]], num_types: int, token_ids: Tensor, start_id: int, positions: str = "closing"
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Teacher-forced inputs for bracket sequences and the predictions WCPA judges in them.

    Row b reads ``start_id`` then its sequence but the last bracket (``token_ids`` maps bracket ids to the
    model's token ids), so the output at time t predicts bracket t. Returns ``inputs`` ``[T, B]`` (padded
    with ``start_id``), ``where`` ``[N, 2]`` (time, row), ``types`` ``[N]`` and ``distances`` ``[N]``."""
    inputs = torch.full((max(len(s) for s in sequences), len(sequences)), start_id, dtype=torch.long)  # [T, B]
    where, types, distances = [], [], []
    for b, s in enumerate(sequences):
        inputs[1 : len(s), b] = token_ids[torch.as_tensor(list(s[:-1]), dtype=torch.long)]
        for j, kind, distance in closing_predictions(s, num_types, positions):
            where.append((j, b))
            types.append(kind)
            distances.append(distance)
    as_long = lambda x: torch.tensor(x, dtype=torch.long)  # noqa: E731
    return inputs, as_long(where).view(-1, 2), as_long(types), as_long(distances)


@torch.no_grad()
def evaluate_wcpa(
    next_log_probs: Callable[[Tensor], Tensor],
    sequences: Sequence[Sequence[int]],
    num_types: int,
    token_ids: Tensor,
    start_id: int,
    close_ids: Tensor,
    positions: str = "closing",
    batch_size: int = 64,
    edges: Sequence[int] | None = None,
    min_count: int = MIN_COUNT,
    normalised: bool = False,
) -> WCPAResult:
    """WCPA of a model on bracket sequences. ``next_log_probs(inputs [T, B]) -> [T, B, V]`` are its next-token
    log-probabilities (each row from a zero state); ``close_ids`` ``[k]`` are the closing brackets' ids in V;
    ``normalised``: judge the mass among closing brackets (Hewitt et al.), not the mass itself (the report)."""
    probabilities, distances = [], []
    for start in range(0, len(sequences), batch_size):
        inputs, where, types, d = prediction_batch(sequences[start : start + batch_size], num_types, token_ids,
                                                   start_id, positions)
        if len(types):
            probabilities.append(closing_probabilities(next_log_probs(inputs).float().cpu(), close_ids, where, types,
                                                       normalised))
            distances.append(d)
    if not probabilities:
        return wcpa_from_probabilities(np.zeros(0), np.zeros(0, dtype=np.int64), edges, THRESHOLD, min_count)
    return wcpa_from_probabilities(torch.cat(probabilities), torch.cat(distances), edges, THRESHOLD, min_count)
