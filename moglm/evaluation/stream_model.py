"""The one contract between a model and the code that scores and adapts it: evaluation, dynamic evaluation
(Krause thesis ch. 4-6), its statistics and search, and the neural cache.

A *stream model* reads a token stream segment by segment and carries a state across segments:

    nll(tokens [T, B], targets [T, B], state=None, factor=1.0) -> (nll [T, B], state)
    nll_features(tokens, targets, state=None, factor=1.0) -> (nll [T, B], features [T, B, H], state)

``nll`` is the per-token negative log-likelihood of ``targets`` given ``tokens`` and everything the state
summarises (``factor`` multiplies the logits: the softmax temperature); ``features`` are the vectors the
output layer reads (the neural cache's keys). It is an ``nn.Module`` (parameters by name, ``eval()``).
Three kinds of model keep it:

* moglm's recurrent :class:`~moglm.model.language_model.LanguageModel`: the state is the recurrent state;
* the same with a Transformer (:mod:`moglm.model.transformer`): the state is the segment memory (Transformer-XL);
* any causal LM with a bounded context (:class:`~moglm.evaluation.context_window.ContextWindowLM`, e.g. a
  Hugging Face model): the state is the last ``context`` tokens, the conditioning of the next segment.

Every state tensor holds the streams along its dimension 1 (:func:`repeat_state` copies one stream's state
for several). Whoever carries the state detaches it between segments (:func:`detach_state`), so gradients
never leave a segment: a segment's update is driven by its own losses only (thesis 4.3 and 6.2.2).

``reads_in_segments``: true where a token's prediction depends on where the stream was cut (an attention
model sees its memory plus the segment so far), so a static pass must cut the stream as dynamic evaluation
does to be comparable (:func:`static_window`); a recurrent model's does not.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@runtime_checkable
class StreamModel(Protocol):
    """What scoring and adapting need of a model (module docstring)."""

    def nll(self, tokens: Tensor, targets: Tensor, state: Any = None, factor: float = 1.0) -> tuple[Tensor, Any]: ...

    def nll_features(self, tokens: Tensor, targets: Tensor, state: Any = None,
                     factor: float = 1.0) -> tuple[Tensor, Tensor, Any]: ...


def detach_state(state: Any) -> Any:
    """``state`` with every tensor detached (tensors, tuples and lists of them, or ``None``)."""
    if state is None:
        return None
    if isinstance(state, Tensor):
        return state.detach()
    return type(state)(detach_state(s) for s in state)


def repeat_state(state: Any, copies: int) -> Any:
    """The state of one stream as that of ``copies`` streams that go on from it side by side: every state tensor
    holds the streams along its dimension 1 (a recurrent stack's ``[L, B, H]``, a Transformer's memory
    ``[L, B, M, H]``, a context window's ``[C, B]``)."""
    if state is None:
        return None
    if isinstance(state, Tensor):
        return state.repeat_interleave(copies, dim=1)
    return type(state)(repeat_state(s, copies) for s in state)


def reads_in_segments(model: nn.Module) -> bool:
    """Whether ``model``'s predictions depend on how the stream is cut (module docstring)."""
    return bool(getattr(model, "reads_in_segments", False))


def static_window(model: nn.Module, bptt: int, segment_length: int) -> int:
    """The window a static pass compared with dynamic evaluation in segments of ``segment_length`` should
    read: the segment length for a model that reads in segments, else ``bptt`` (the fastest)."""
    return segment_length if reads_in_segments(model) else bptt


@contextmanager
def dropout_scaled(model: nn.Module, multiplier: float):
    """Every dropout rate of ``model`` times ``multiplier`` for the block (MC dropout): the model's own
    ``dropout_scaled`` when it has one, else every ``nn.Dropout`` submodule's ``p``."""
    own = getattr(model, "dropout_scaled", None)
    if own is not None:
        with own(multiplier):
            yield model
        return
    dropouts = [m for m in model.modules() if isinstance(m, nn.modules.dropout._DropoutNd)]
    saved = [m.p for m in dropouts]
    try:
        for m in dropouts:
            m.p = m.p * multiplier
        yield model
    finally:
        for m, p in zip(dropouts, saved):
            m.p = p


def state_rows(state: Any, rows: Tensor) -> Any:
    """The streams ``rows`` (indices ``[R]``) of ``state``: every state tensor holds the streams along its
    dimension 1 (a recurrent stack's ``[L, B, H]``, a Transformer's memory ``[L, B, M, H]`` and ``[L, B, M]``)."""
    if state is None:
        return None
    if isinstance(state, Tensor):
        return state.index_select(1, rows.to(state.device))
    return type(state)(state_rows(s, rows) for s in state)


def join_state_rows(states: list[Any]) -> Any:
    """The states of single streams (each with one row on dimension 1) as one state of ``len(states)`` streams.
    A ``None`` (a zero state) becomes zeros, and a Transformer's memories of different lengths are padded at the
    front with zero slots, which its ``valid`` mask marks empty: each stream goes on as from its own state."""
    like = next((s for s in states if s is not None), None)
    if like is None:
        return None
    if isinstance(like, Tensor):
        parts = [torch.zeros_like(like) if s is None else s for s in states]
        if like.dim() > 2:  # a memory axis on dimension 2: pad it at the front to the longest
            longest = max(p.shape[2] for p in parts)
            parts = [F.pad(p, [0, 0] * (p.dim() - 3) + [longest - p.shape[2], 0]) for p in parts]
        return torch.cat(parts, 1)
    return type(like)(join_state_rows([None if s is None else s[i] for s in states]) for i in range(len(like)))
