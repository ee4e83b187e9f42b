"""Monte-Carlo dropout evaluation (Gal & Ghahramani 2016; the paper's "MC" rows; docs/method.md "Evaluation").

S passes with every dropout rate multiplied by ``multiplier``, each with its own stochastic state; the
per-token probability is the arithmetic mean over samples. The S passes over one stream run at once,
as S rows of a batch with independent masks.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..data.batching import StreamBatches
from ..data.corpus import TextSize
from ..model.language_model import LanguageModel
from ..progress import progress_bar
from .scores import Scores, scored


@torch.no_grad()
def evaluate_mc_dropout(
    model: LanguageModel,
    ids: np.ndarray,
    samples: int = 200,
    multiplier: float = 0.75,
    bptt: int = 70,
    factor: float = 1.0,
    max_tokens: int | None = None,
    text: TextSize | None = None,
    progress: bool = False,
) -> Scores:
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    was_training = model.training
    device = next(model.parameters()).device
    stream = np.asarray(ids if max_tokens is None else ids[: max_tokens + 1])
    batches = StreamBatches(stream, 1, bptt)
    total, count, state = 0.0, 0, None
    bar = progress_bar(len(batches), "mc-dropout", tokens_per_step=bptt, enabled=progress)
    model.train()
    try:
        with model.dropout_scaled(multiplier):
            for batch in batches:
                inputs = batch.inputs.to(device).expand(-1, samples)  # [T, S]: one stream, S samples
                targets = batch.targets.to(device).expand(-1, samples)
                nll, state = model.nll(inputs, targets, state, factor)  # [T, S]
                log_p = torch.logsumexp(-nll.double(), dim=1) - math.log(samples)  # [T] log mean prob
                total -= float(log_p.sum())
                count += log_p.numel()
                bar.update(1)
    finally:
        bar.close()
        model.train(was_training)
    return scored(total, count, len(stream), text if max_tokens is None else None)


#: the dropout multipliers MC dropout's search tries (the Mogrifier paper, section 3.3: "dropout rates are scaled",
#: after Melis et al. 2018, who search the scale on validation)
MULTIPLIERS = (0.25, 0.5, 0.75, 1.0)


def search_multiplier(model: LanguageModel, valid: np.ndarray, samples: int, bptt: int = 70, factor: float = 1.0,
                      tokens: int = 10_000, candidates=MULTIPLIERS) -> tuple[float, dict[str, float]]:
    """The dropout multiplier whose MC-dropout cross-entropy on the first ``tokens`` validation tokens is lowest,
    and every candidate's cross-entropy. Each candidate is scored from the same random state, so the choice does
    not depend on the order they are tried in."""
    scored = {}
    for m in candidates:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            scored[str(m)] = evaluate_mc_dropout(model, valid, samples, m, bptt, factor, max_tokens=tokens).xent
    best = min(candidates, key=lambda m: scored[str(m)])
    return float(best), scored
