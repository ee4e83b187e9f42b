"""Sampling text from a language model: a prompt, a temperature and optional top-k truncation.

With an ``adapter`` (a :class:`moglm.dynamic_evaluation.DynamicEvaluator`) the model first adapts to
the prompt by dynamic evaluation and, with ``adapt_output``, keeps adapting to its own output while it
samples: each segment of n tokens is drawn with fixed weights, then one update is taken on that
segment's loss (Krause thesis 4.3 and 5.2)."""

from __future__ import annotations

import math

import torch

from .data.vocabulary import Vocabulary
from .errors import MoglmError
from .model.language_model import LanguageModel


def _prompt_tokens(vocab: Vocabulary, prompt: str) -> list[str]:
    """Tokens of ``prompt``; for word and PTB-char vocabularies a newline is the ``<eos>`` token."""
    if vocab.eos is None or vocab.level not in ("word", "ptb_char"):
        return vocab.tokenize_prompt(prompt)
    lines = prompt.split("\n")
    return [t for i, line in enumerate(lines) for t in vocab.tokenize_prompt(line) + [vocab.eos] * (i < len(lines) - 1)]


class NoStart(MoglmError):
    """A prompt that cannot start a sample: a token the vocabulary lacks (and no ``<unk>`` to read it as), or an
    empty prompt where the corpus has no line separator."""


def unknown_prompt_tokens(vocab: Vocabulary, prompt: str) -> list[str]:
    """The prompt's tokens that are not in the vocabulary (each once, in order): they are read as ``<unk>``."""
    return list(dict.fromkeys(t for t in _prompt_tokens(vocab, prompt) if t not in vocab.stoi))


def encode_prompt(vocab: Vocabulary, prompt: str) -> list[int]:
    """Prompt tokens as ids, preceded by the line separator (every line in training ends with one)."""
    ids = []
    start = vocab.eos if vocab.eos is not None else ("\n" if "\n" in vocab else None)
    if start is not None:
        ids.append(vocab.stoi[start])
    for token in _prompt_tokens(vocab, prompt):
        if token in vocab.stoi:
            ids.append(vocab.stoi[token])
        elif vocab.unk is not None:
            ids.append(vocab.stoi[vocab.unk])
        else:
            raise NoStart(f"prompt: {token!r} is not in the vocabulary")
    if not ids:
        raise NoStart("prompt: empty, and the vocabulary has no line separator to start from")
    return ids


def next_token(log_p: torch.Tensor, temperature: float, top_k: int | None = None,
               generator: torch.Generator | None = None) -> int:
    """One token drawn from next-token log-probabilities ``log_p`` ``[V]`` divided by ``temperature`` (the most
    likely one at ``temperature`` 0), among the ``top_k`` most likely when given."""
    if temperature == 0:
        return int(torch.argmax(log_p))
    logits = log_p / temperature  # [V]
    if top_k is not None and top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return int(torch.multinomial(torch.softmax(logits.float(), -1).cpu(), 1, generator=generator))


@torch.no_grad()
def sample(
    model: LanguageModel,
    vocab: Vocabulary,
    prompt: str = "",
    num_tokens: int = 200,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    adapter=None,
    adapt_output: bool = False,
) -> str:
    """Continue ``prompt`` by ``num_tokens`` tokens; returns the prompt followed by the continuation.
    ``adapter``: adapt to the prompt first (and, with ``adapt_output``, to the sample as it grows)."""
    if not (math.isfinite(temperature) and temperature > 0):
        raise MoglmError(f"temperature must be a finite number > 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise MoglmError(f"top_k must be >= 1, got {top_k}")
    if adapt_output and adapter is None:
        raise MoglmError("adapting to the output needs an adapter (dynamic evaluation settings)")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    ids = encode_prompt(vocab, prompt)
    net = model if adapter is None else adapter.model  # the adapter works on its own copy
    try:
        prompt_ids = torch.tensor(ids, device=device).view(-1, 1)  # [T, 1]
        before = None  # the state before the current segment's first input
        if adapter is None:
            log_p, state = model.log_probs(prompt_ids)  # [T, 1, V]
        else:
            if len(ids) > 1:
                before = adapter.adapt_to(prompt_ids[:-1], prompt_ids[1:])  # updates along the prompt
            log_p, state = net.log_probs(prompt_ids[-1:], before)  # [1, 1, V]
        out: list[int] = []
        segment = ids[-1:]  # inputs of the segment being generated (adapt_output)
        for _ in range(num_tokens):
            token = next_token(log_p[-1, 0], temperature, top_k, generator)
            out.append(token)
            if adapt_output:
                if len(segment) == adapter.hp.segment_length:  # a segment is complete: update on it
                    targets = torch.tensor(segment[1:] + [token], device=device).view(-1, 1)  # [n, 1]
                    # carry on from the update's own pass (after a rollback, the rescored one: never non-finite)
                    _, state = adapter.step(torch.tensor(segment, device=device).view(-1, 1), targets, before)
                    segment, before = [], state
                segment.append(token)
            log_p, state = net.log_probs(torch.tensor([[token]], device=device), state)
    finally:
        model.train(was_training)
    return prompt + vocab.decode(out) if vocab.level != "word" else (prompt + " " + vocab.decode(out)).strip()
