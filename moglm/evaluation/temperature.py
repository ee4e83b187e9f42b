"""Softmax-temperature search (docs/method.md, "Evaluation"): the logits are multiplied by a factor chosen on
~50k validation tokens, trying 1.06, 1.04, ... down to 0.80 and stopping after two non-improvements."""

from __future__ import annotations

import numpy as np
import torch

from ..model.language_model import LanguageModel
from .stream import stream_features

FACTORS = tuple(round(1.06 - 0.02 * i, 2) for i in range(14))  # 1.06 ... 0.80


@torch.no_grad()
def search_temperature(
    model: LanguageModel,
    ids: np.ndarray,
    max_tokens: int = 50_000,
    batch_size: int = 16,
    bptt: int = 70,
    factors: tuple[float, ...] = FACTORS,
    patience: int = 2,
) -> tuple[float, dict[float, float]]:
    """Best logit factor and the validation cross-entropy of every factor tried. The recurrent network
    runs once; only the output head is re-evaluated per factor."""
    was_training = model.training
    model.eval()
    try:
        h, targets = stream_features(model, ids, batch_size, bptt, max_tokens)  # [N, H], [N]
        tried: dict[float, float] = {}
        best, misses = None, 0
        for f in factors:
            xent = 0.0
            for start in range(0, h.shape[0], 8192):  # chunks bound the [n, V] logits' memory
                xent += float(model.head.nll(h[start : start + 8192], targets[start : start + 8192],
                                             model.decoder_weight, f).double().sum())
            tried[f] = xent / h.shape[0]
            if best is None or tried[f] < tried[best]:
                best, misses = f, 0
            else:
                misses += 1
                if misses >= patience:
                    break
    finally:
        model.train(was_training)
    return float(best), tried
