"""Sampling: prompts, temperature, top-k, seeds."""

from __future__ import annotations

import pytest
import torch

from moglm.data import Vocabulary
from moglm.errors import MoglmError
from moglm.model import LanguageModel
from moglm.sampling import encode_prompt, sample


def _setup():
    torch.manual_seed(0)
    vocab = Vocabulary(["<eos>", "a", "b", "c", "<unk>"], "word", unk="<unk>", eos="<eos>")
    model = LanguageModel(len(vocab), 8, 1, "lstm")
    return model, vocab


def test_the_prompt_starts_after_a_line_separator_and_unknown_words_become_unk():
    _, vocab = _setup()
    assert encode_prompt(vocab, "a zzz b") == [0, 1, 4, 2]


def test_top_k_one_is_greedy_and_a_seed_makes_sampling_repeatable():
    model, vocab = _setup()
    greedy = sample(model, vocab, "a", 6, top_k=1)
    tokens = [vocab.stoi["<eos>"], vocab.stoi["a"]]
    with torch.no_grad():
        for _ in range(6):
            lp, _ = model.eval().log_probs(torch.tensor(tokens).view(-1, 1))
            tokens.append(int(lp[-1, 0].argmax()))
    assert greedy == ("a " + vocab.decode(tokens[2:])).strip()
    one = sample(model, vocab, "a", 10, temperature=1.5, generator=torch.Generator().manual_seed(1))
    two = sample(model, vocab, "a", 10, temperature=1.5, generator=torch.Generator().manual_seed(1))
    assert one == two


def test_bad_sampling_arguments_are_errors():
    model, vocab = _setup()
    with pytest.raises(MoglmError, match="temperature"):
        sample(model, vocab, "a", 3, temperature=0)
    with pytest.raises(MoglmError, match="top_k"):
        sample(model, vocab, "a", 3, top_k=0)
