"""The neural cache beside dynamic evaluation and combined with it (Krause thesis 2.2.1, tables 4.1-4.2).

:mod:`moglm.evaluation.neural_cache` mixes a model's per-token probability with a cache over the recent
positions' features; it needs only the per-token nll and the features of a pass. So one static pass and
one dynamic pass that keep their features (``features=True``) give all four rows: static, static +
cache, dynamic, dynamic + cache. The cache reads the features the *adapted* model produced, and the
adaptation never sees the cache (it has no parameters), so the adaptation is the same either way.

theta and lambda are searched on the validation prefix that dynamic evaluation is tuned on, once for
the static model and once for the adapted one (the best lambda of an adapted model is smaller: it
already predicts the repeats the cache catches). The cache size is fixed (``CACHE_SIZE``), as the thesis
fixes it before searching the other two.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..data.batching import stripes
from ..errors import MoglmError
from ..evaluation.neural_cache import CacheSearch, CacheSettings, cache_nll, search_cache
from ..evaluation.scores import Scores

CACHE_SIZE = 500  # positions (Grave et al. use 100-2000; 500 is within the range they found best on PTB)


def stream_targets(ids: np.ndarray, streams: int, length: int) -> Tensor:
    """The targets ``[length, streams]`` of a stream read as ``streams`` stripes, in the per-token losses'
    order (:func:`moglm.evaluation.stream.evaluate_stream`)."""
    return stripes(ids, streams)[1 : length + 1]  # [L, B]


def mixed_scores(losses: Tensor, features: Tensor, targets: Tensor, settings: CacheSettings,
                 like: Scores) -> tuple[Scores, Tensor]:
    """Scores and per-token losses ``[L, B]`` of ``losses`` ``[L, B]`` mixed with the cache, stripe by stripe
    (each stripe its own cache); ``like``: the unmixed scores whose word count they share."""
    if features is None:
        raise MoglmError("the neural cache needs the pass's features (evaluate with features=True)")
    mixed = [cache_nll(losses[:, b], features[:, b], targets[:, b], settings) for b in range(losses.shape[1])]
    out = torch.stack(mixed, 1)  # [L, B]
    return Scores(float(out.double().sum()), out.numel(), like.words, like.characters, like.bytes), out


def tune(losses: Tensor, features: Tensor, targets: Tensor, size: int = CACHE_SIZE) -> CacheSearch:
    """theta and lambda searched on a validation pass's outputs (``[L, B]``, ``[L, B, H]``, ``[L, B]``)."""
    return search_cache(losses, features, targets, size)


@dataclass
class CacheReport:
    """The settings searched for the static and for the adapted model, with their validation scores."""

    static: CacheSearch
    dynamic: CacheSearch | None = None

    def as_dict(self) -> dict:
        def one(search: CacheSearch | None) -> dict | None:
            if search is None:
                return None
            return {"theta": search.best.theta, "lambda": search.best.lam, "size": search.best.size,
                    "valid_xent_without": search.base_xent, "valid_xent_with": search.xent}
        return {"static": one(self.static), "dynamic": one(self.dynamic)}
