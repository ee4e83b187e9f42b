"""Evaluation over a token stream: the split as ``batch_size`` stripes read window by window, state
carried across windows from a zero start. ``batch_size=1`` is the paper's final setting: one
continuous stream."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ..data.batching import EpisodicBatches, StreamBatches
from ..data.corpus import TextSize
from ..model.language_model import LanguageModel
from ..progress import progress_bar
from .scores import Scores, scored


def _windows(ids: np.ndarray, batch_size: int, bptt: int, max_tokens: int | None) -> StreamBatches:
    if max_tokens is not None:
        ids = ids[: max_tokens + batch_size]  # +batch_size: each stripe's last token is only a target
    return StreamBatches(ids, batch_size, bptt)


@torch.no_grad()
def evaluate_stream(
    model: LanguageModel,
    ids: np.ndarray,
    batch_size: int = 1,
    bptt: int = 70,
    factor: float = 1.0,
    max_tokens: int | None = None,
    text: TextSize | None = None,
    progress: bool = False,
    desc: str = "evaluate",
    per_token: bool = False,
    features: bool = False,
) -> Scores | tuple[Scores, Tensor] | tuple[Scores, Tensor, Tensor]:
    """Scores of ``model`` (any :class:`~moglm.evaluation.stream_model.StreamModel`, in eval mode) on ``ids``.
    ``factor`` multiplies the logits (temperature); ``text``: the words and bytes ``ids`` spell, for bits per word
    and per byte of a whole split (a ``max_tokens`` prefix reports neither). With ``per_token`` also returns the per-token losses
    ``[L, B]`` (stream order per stripe), and with ``features`` too the output layer's features ``[L, B, H]``."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    batches = _windows(ids, batch_size, bptt, max_tokens)
    state = None
    total, count, losses, kept = 0.0, 0, [], []
    bar = progress_bar(len(batches), desc, tokens_per_step=bptt * batch_size, enabled=progress)
    try:
        for batch in batches:
            batch = batch.to(device)
            if features:
                nll, h, state = model.nll_features(batch.inputs, batch.targets, state, factor)  # [T, B], [T, B, H]
                kept.append(h.cpu())
            else:
                nll, state = model.nll(batch.inputs, batch.targets, state, factor)  # [T, B]
            total += float(nll.double().sum())
            count += nll.numel()
            if per_token or features:
                losses.append(nll.cpu())
            bar.update(1)
    finally:
        bar.close()
        model.train(was_training)
    scores = scored(total, count, len(ids), text if max_tokens is None else None)
    if features:
        return scores, torch.cat(losses), torch.cat(kept)
    return (scores, torch.cat(losses)) if per_token else scores


@torch.no_grad()
def stream_features(
    model: LanguageModel, ids: np.ndarray, batch_size: int, bptt: int, max_tokens: int | None = None
) -> tuple[Tensor, Tensor]:
    """Features before the output head ``[N, H]`` and their targets ``[N]`` (eval mode), so several
    softmax temperatures can be scored with one pass of the recurrent network."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    feats, targets, state = [], [], None
    try:
        for batch in _windows(ids, batch_size, bptt, max_tokens):
            batch = batch.to(device)
            h, state = model(batch.inputs, state)  # [T, B, H]
            feats.append(h.flatten(0, 1))
            targets.append(batch.targets.flatten())
    finally:
        model.train(was_training)
    return torch.cat(feats), torch.cat(targets)


@torch.no_grad()
def evaluate_episodes(
    model: LanguageModel,
    ids: np.ndarray,
    separator: int,
    batch_size: int = 16,
    max_tokens: int | None = None,
    factor: float = 1.0,
) -> Scores:
    """Episodic evaluation: every sequence (line) scored from a zero state, predicted from a leading
    separator, padding masked out."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    if max_tokens is not None:
        ids = ids[:max_tokens]
    total, count = 0.0, 0
    try:
        for batch in EpisodicBatches(ids, separator, batch_size):
            batch = batch.to(device)
            nll, _ = model.nll(batch.inputs, batch.targets, None, factor)  # [T, B]
            total += float((nll * batch.mask).double().sum())
            count += batch.num_tokens
    finally:
        model.train(was_training)
    return Scores(total, count)
