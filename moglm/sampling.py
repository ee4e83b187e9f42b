"""Sampling text from a language model: a prompt, a temperature and optional top-k truncation."""

from __future__ import annotations

import torch

from .data.vocabulary import Vocabulary
from .errors import MoglmError
from .model.language_model import LanguageModel


def encode_prompt(vocab: Vocabulary, prompt: str) -> list[int]:
    """Prompt tokens as ids, preceded by the line separator (every line in training ends with one)."""
    ids = []
    start = vocab.eos if vocab.eos is not None else ("\n" if "\n" in vocab else None)
    if start is not None:
        ids.append(vocab.stoi[start])
    for token in vocab.tokenize_prompt(prompt):
        if token in vocab.stoi:
            ids.append(vocab.stoi[token])
        elif vocab.unk is not None:
            ids.append(vocab.stoi[vocab.unk])
        else:
            raise MoglmError(f"prompt: {token!r} is not in the vocabulary")
    if not ids:
        raise MoglmError("prompt: empty, and the vocabulary has no line separator to start from")
    return ids


@torch.no_grad()
def sample(
    model: LanguageModel,
    vocab: Vocabulary,
    prompt: str = "",
    num_tokens: int = 200,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> str:
    """Continue ``prompt`` by ``num_tokens`` tokens; returns the prompt followed by the continuation."""
    if temperature <= 0:
        raise MoglmError(f"temperature must be > 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise MoglmError(f"top_k must be >= 1, got {top_k}")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    ids = encode_prompt(vocab, prompt)
    try:
        log_p, state = model.log_probs(torch.tensor(ids, device=device).view(-1, 1))  # [T, 1, V]
        out: list[int] = []
        for _ in range(num_tokens):
            logits = log_p[-1, 0] / temperature  # [V]
            if top_k is not None and top_k < logits.numel():
                kth = torch.topk(logits, top_k).values[-1]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            token = int(torch.multinomial(torch.softmax(logits.float(), -1).cpu(), 1, generator=generator))
            out.append(token)
            log_p, state = model.log_probs(torch.tensor([[token]], device=device), state)
    finally:
        model.train(was_training)
    return prompt + vocab.decode(out) if vocab.level != "word" else (prompt + " " + vocab.decode(out)).strip()
