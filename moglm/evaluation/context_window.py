"""Any causal language model with a bounded context as a stream model (Krause thesis 6.3.2).

A vanilla Transformer (GPT-2) has no segment memory: it sees a window of at most ``n_positions`` tokens.
It reads a stream in segments of n tokens, each conditioned on up to ``context`` tokens before it; the
state carried from segment to segment is those last ``context`` token ids, so the model keeps the
:mod:`~moglm.evaluation.stream_model` contract and every evaluator (static, dynamic, the neural cache)
reads it as it reads a recurrent model. The thesis's GPT-2 setting is a window of 1024 = 992 + 32.

Gradients: a segment's loss is its own tokens' (the context's tokens were scored by earlier segments).
A model with a key/value cache (any Hugging Face causal LM) encodes the context without gradient and
the segment attends to those keys and values, so backpropagation stays inside the segment as it does
for Transformer-XL in the thesis (6.2.2) and for the recurrent models here: dynamic evaluation then
costs the static pass plus a backward pass over the segment only. A model without a cache (any module
mapping ids ``[B, L]`` to logits ``[B, L, V]``) reads context and segment in one pass, and the segment's
loss backpropagates through the context's activations too.

Every model is probed before it is read (:func:`check_causal`): it must map ids to logits, and changing
the last token must leave the earlier positions' logits alone, so an encoder or a bidirectional model is
a one-line error instead of a score that has seen the tokens it predicts.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import MoglmError


def is_huggingface(model: nn.Module) -> bool:
    """A ``transformers`` model (it has a config and takes a key/value cache)."""
    return hasattr(model, "config") and hasattr(model, "get_output_embeddings")


def max_positions(model: nn.Module) -> int | None:
    """The longest window a Hugging Face model reads (``n_positions`` / ``max_position_embeddings``)."""
    config = getattr(model, "config", None)
    for name in ("n_positions", "max_position_embeddings", "n_ctx"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


class ContextWindowLM(nn.Module):
    """``model`` read as a stream in segments, each conditioned on up to ``context`` earlier tokens.

    ``model``: a Hugging Face causal LM, or a module mapping ids ``[B, L]`` to logits ``[B, L, V]`` (or to
    an object with ``.logits``). The state is the last ``context`` ids ``[C, B]`` (``None``: none yet).
    """

    reads_in_segments = True

    def __init__(self, model: nn.Module, context: int) -> None:
        super().__init__()
        if not isinstance(context, int) or context < 0:
            raise ValueError(f"context must be an integer >= 0, got {context!r}")
        self.model, self.context = model, context
        self.cached = is_huggingface(model)
        # transformers 5 names the key/value cache ``cache``; earlier releases ``past_key_values``
        self._cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        check_causal(model)

    def check_window(self, segment_length: int) -> None:
        """A one-line error when ``context + segment_length`` exceeds the model's positions."""
        limit = max_positions(self.model)
        if limit is not None and self.context + segment_length > limit:
            raise ValueError(f"context {self.context} + segment length {segment_length} exceeds the model's "
                             f"{limit} positions")

    def nll(self, tokens: Tensor, targets: Tensor, state: Tensor | None = None,
            factor: float = 1.0) -> tuple[Tensor, Tensor]:
        """Per-token nll ``[T, B]`` of ``targets`` given ``tokens`` ``[T, B]`` and the context ``state``."""
        logits, _, state = self._read(tokens, state, features=False)
        return _nll(logits, targets, factor), state

    def nll_features(self, tokens: Tensor, targets: Tensor, state: Tensor | None = None,
                     factor: float = 1.0) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`nll` and the last layer's hidden states ``[T, B, H]`` (the neural cache's keys)."""
        logits, features, state = self._read(tokens, state, features=True)
        if features is None:
            raise ValueError("this model returns no hidden states, which the neural cache needs")
        return _nll(logits, targets, factor), features, state

    def _read(self, tokens: Tensor, state: Tensor | None, features: bool) -> tuple[Tensor, Tensor | None, Tensor]:
        """Logits ``[T, B, V]``, features ``[T, B, H]`` or None, and the next context ``[C', B]``."""
        t = tokens.shape[0]
        context = state if state is not None and state.shape[0] else None
        if self.cached:
            past = None
            if context is not None:
                with torch.no_grad():
                    encoded = self.model(input_ids=context.t(), use_cache=True)
                past = getattr(encoded, self._cache_arg)
            out = self.model(input_ids=tokens.t(), use_cache=past is not None, output_hidden_states=features,
                             **{self._cache_arg: past})
            logits = out.logits.transpose(0, 1)  # [T, B, V]
            hidden = out.hidden_states[-1].transpose(0, 1) if features else None  # [T, B, H]
        else:
            window = tokens if context is None else torch.cat([context, tokens])  # [C+T, B]
            out: Any = self.model(window.t())
            logits = getattr(out, "logits", out).transpose(0, 1)[-t:]  # [T, B, V]
            hidden = None
            if features and getattr(out, "hidden_states", None) is not None:
                hidden = out.hidden_states[-1].transpose(0, 1)[-t:]
        joined = tokens if context is None else torch.cat([context, tokens])  # [C+T, B]
        return logits, hidden, joined[max(0, joined.shape[0] - self.context):]


def check_causal(model: nn.Module, length: int = 6) -> None:
    """A one-line :class:`MoglmError` unless ``model`` maps ids ``[B, L]`` to logits ``[B, L, V]`` and each
    position's logits ignore the tokens after it (changing the last token must leave the others' logits as
    they were): a bidirectional or encoder model would score each token after reading it."""
    name = type(model).__name__
    device = next(model.parameters(), torch.empty(0)).device
    ids = torch.tensor([[i % 2 for i in range(length)]], device=device)  # [1, L]: ids 0 and 1 exist in any vocabulary
    changed = ids.clone()
    changed[0, -1] = 1 - changed[0, -1]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = [_logits(model, x) for x in (ids, changed)]  # 2 x [1, L, V]
    except Exception as e:  # anything the model raises on plain ids means it has no such interface
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise MoglmError(f"{name} has no causal-LM interface: calling it on token ids [1, {length}] raised "
                         f"{type(e).__name__}: {first}") from None
    finally:
        model.train(was_training)
    for out in logits:
        if not (isinstance(out, Tensor) and out.dim() == 3 and out.shape[:2] == (1, length) and out.shape[2] > 1
                and out.is_floating_point()):
            got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            raise MoglmError(f"{name} has no causal-LM interface: token ids [1, {length}] must give logits "
                             f"[1, {length}, V] (or an output with .logits), got {got}")
    before, after = (out[0, :-1].double() for out in logits)  # [L-1, V]
    if not torch.allclose(before, after, rtol=1e-4, atol=1e-4 * float(before.abs().max()) + 1e-6):
        raise MoglmError(f"{name} is not a causal LM: changing the last token changed the logits at earlier "
                         "positions (a bidirectional or encoder model cannot score a text left to right)")


def _logits(model: nn.Module, ids: Tensor) -> Any:
    """What ``model`` gives for ``ids`` ``[B, L]``: its logits tensor, or whatever else it returned."""
    out = model(input_ids=ids) if is_huggingface(model) else model(ids)
    return getattr(out, "logits", out)


def _nll(logits: Tensor, targets: Tensor, factor: float) -> Tensor:
    """Per-token cross-entropy ``[T, B]`` of ``logits`` ``[T, B, V]`` times ``factor``, in float32 at least."""
    scaled = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    if factor != 1.0:
        scaled = scaled * factor
    return F.cross_entropy(scaled.flatten(0, 1), targets.flatten(), reduction="none").view_as(targets)
