"""A run's model answering lm-evaluation-harness's three questions about text, with no lm-eval import
(:mod:`moglm.harness.model` is the adapter):

* :meth:`RunScorer.rolling`: the log-likelihood of a whole document, read as one stream from a zero state and
  the line separator every training line ends with (so the first token is predicted in context, as in the
  corpus), the recurrent state carried across the document in windows of the run's ``bptt``: exactly
  :func:`~moglm.evaluation.stream.evaluate_stream`, so a document that is a test split scores what
  ``moglm evaluate`` scores. Nothing is re-read: a recurrent model's context is its state.
* :meth:`RunScorer.rolling_dynamic`: the same with dynamic evaluation (Krause et al. 2018; Krause thesis ch. 4),
  :func:`~moglm.dynamic_evaluation.across_processes.evaluate_streams` as ``moglm dyneval`` calls it: the weights
  adapt segment by segment along the document and start from the trained ones at every document.
* :meth:`RunScorer.loglikelihood`: the log-likelihood of continuations given contexts: each distinct context
  is read once, and its continuations are read side by side from its final state.
* :meth:`RunScorer.generate`: greedy or sampled continuation, one model step per token, until a stop string.

Text becomes tokens as ``moglm sample`` reads a prompt (:func:`~moglm.sampling.encode_prompt`): words split on
whitespace with newlines as ``<eos>`` for word runs, characters or UTF-8 bytes otherwise; tokens the
vocabulary lacks are read as ``<unk>`` (counted in :attr:`RunScorer.unknown`) or refused where it has none.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..data.vocabulary import Vocabulary
from ..dynamic_evaluation import DynamicResult, Hyperparameters
from ..dynamic_evaluation.across_processes import evaluate_streams
from ..dynamic_evaluation.evaluate import DEFAULT_MARGIN
from ..errors import MoglmError
from ..evaluation.stream import evaluate_stream
from ..evaluation.stream_model import repeat_state, static_window
from ..model.language_model import LanguageModel
from ..sampling import NoStart, encode_prompt, next_token, unknown_prompt_tokens

#: continuations of one context read side by side at most (their log-probabilities are ``[T, B, V]``)
SIDE_BY_SIDE = 32


@dataclass(frozen=True)
class Adaptation:
    """Dynamic evaluation's settings for :meth:`RunScorer.rolling_dynamic`: the update rule's hyperparameters,
    the global RMS statistics the rms rules divide by (``None`` for the others), the divergence guard's margin."""

    hp: Hyperparameters
    rms: dict[str, Tensor] | None = None
    margin: float = DEFAULT_MARGIN


class RunScorer:
    """``model`` (a run's :class:`~moglm.model.language_model.LanguageModel`, in eval mode) with its vocabulary,
    logit ``factor`` (inverse softmax temperature) and window ``bptt``; ``adaptation``: for dynamic rolling
    scores."""

    def __init__(self, model: LanguageModel, vocab: Vocabulary, factor: float, bptt: int,
                 adaptation: Adaptation | None = None) -> None:
        self.model, self.vocab, self.factor, self.bptt, self.adaptation = model.eval(), vocab, factor, bptt, adaptation
        self.device = next(model.parameters()).device
        try:
            self.start = encode_prompt(vocab, "")[0]
        except NoStart:
            raise MoglmError("the run's vocabulary has no line separator (<eos> or a newline) to predict a "
                             "document's first token from") from None
        self.unknown: Counter[str] = Counter()  # tokens read as <unk>: in how many texts each came

    # -- text to ids -----------------------------------------------------------------------------------
    def ids(self, text: str) -> np.ndarray:
        """``text`` as ids ``[N + 1]``: the line separator, then its ``N`` tokens."""
        if self.vocab.unk is not None:
            self.unknown.update(unknown_prompt_tokens(self.vocab, text))
        try:
            return np.asarray(encode_prompt(self.vocab, text), dtype=np.int64)
        except MoglmError as e:  # the vocabulary has no <unk>
            raise MoglmError(f"lm-eval request: {str(e).removeprefix('prompt: ')}, and the run's vocabulary has no "
                             "<unk> to read it as") from None

    def tokens(self, text: str) -> list[int]:
        """``text``'s token ids, without the leading separator."""
        return self.ids(text)[1:].tolist()

    # -- loglikelihood_rolling -------------------------------------------------------------------------
    def rolling(self, text: str) -> float:
        """log P(``text``) in nats, the state carried across it (module docstring)."""
        ids = self.ids(text)
        if len(ids) < 2:
            return 0.0
        return -evaluate_stream(self.model, ids, 1, self.bptt, self.factor).nll

    def rolling_dynamic(self, text: str) -> DynamicResult | None:
        """Dynamic evaluation of ``text`` from the trained weights (``None`` for a text of no token); its
        ``scores.nll`` is -log P(``text``), ``static`` the static pass it was guarded against."""
        if self.adaptation is None:
            raise MoglmError("dynamic scores need dynamic-evaluation settings (dynamic=true)")
        ids = self.ids(text)
        if len(ids) < 2:
            return None
        hp = self.adaptation.hp
        return evaluate_streams(self.model, ids, hp, self.adaptation.rms, streams=1, factor=self.factor,
                                bptt=static_window(self.model, self.bptt, hp.segment_length),
                                margin=self.adaptation.margin)

    # -- loglikelihood ---------------------------------------------------------------------------------
    @torch.no_grad()
    def loglikelihood(self, pairs: list[tuple[str, str]]) -> list[tuple[float, bool]]:
        """log P(continuation | context) in nats, and whether greedy decoding gives the continuation, for each
        ``(context, continuation)``: the context read once, its continuations side by side from its state."""
        results: list[tuple[float, bool] | None] = [None] * len(pairs)
        by_context: dict[str, list[int]] = {}
        for i, (context, _) in enumerate(pairs):
            by_context.setdefault(context, []).append(i)
        for context, members in by_context.items():
            ids = self.ids(context)
            state = self._read(ids[:-1])  # the state before the context's last token
            for k in range(0, len(members), SIDE_BY_SIDE):
                chunk = members[k : k + SIDE_BY_SIDE]
                continuations = [self.tokens(pairs[i][1]) for i in chunk]
                for i, result in zip(chunk, self._continuations(int(ids[-1]), continuations, state)):
                    results[i] = result
        return results  # type: ignore[return-value]

    def _read(self, ids: np.ndarray):
        """The state after reading ``ids`` (one stream, windows of ``bptt``) from a zero state; ``None`` for none."""
        state = None
        tokens = torch.as_tensor(ids, dtype=torch.long, device=self.device).view(-1, 1)  # [N, 1]
        for start in range(0, tokens.shape[0], self.bptt):
            _, state = self.model(tokens[start : start + self.bptt], state)
        return state

    def _continuations(self, last: int, continuations: list[list[int]], state) -> list[tuple[float, bool]]:
        """Log-likelihood and greediness of each continuation after the token ``last`` and ``state``."""
        lengths = [len(c) for c in continuations]
        steps, rows = max(lengths), len(continuations)
        if steps == 0:
            return [(0.0, True)] * rows
        targets = torch.zeros(steps, rows, dtype=torch.long)  # [M, B], padded with 0
        for b, c in enumerate(continuations):
            targets[: len(c), b] = torch.tensor(c, dtype=torch.long)
        inputs = torch.cat([torch.full((1, rows), last, dtype=torch.long), targets[:-1]])  # [M, B]
        mask = torch.arange(steps).unsqueeze(1) < torch.tensor(lengths).unsqueeze(0)  # [M, B]
        inputs, targets, mask = inputs.to(self.device), targets.to(self.device), mask.to(self.device)
        state = repeat_state(state, rows)
        total = torch.zeros(rows, dtype=torch.float64, device=self.device)  # [B]
        greedy = torch.ones(rows, dtype=torch.bool, device=self.device)  # [B]
        for start in range(0, steps, self.bptt):
            window = slice(start, start + self.bptt)
            log_p, state = self.model.log_probs(inputs[window], state, self.factor)  # [T, B, V]
            picked = log_p.gather(2, targets[window].unsqueeze(2)).squeeze(2)  # [T, B]
            total += (picked.double() * mask[window]).sum(0)
            greedy &= ((log_p.argmax(2) == targets[window]) | ~mask[window]).all(0)
        return [(float(t), bool(g)) for t, g in zip(total.tolist(), greedy.tolist())]

    # -- generate_until --------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, context: str, until: list[str], max_tokens: int, temperature: float = 0.0,
                 top_k: int | None = None, generator: torch.Generator | None = None) -> str:
        """The continuation of ``context`` up to (not including) the first stop string of ``until``, at most
        ``max_tokens`` tokens: the most likely token at each step at ``temperature`` 0, else sampled from the
        run's distribution (its logit factor) divided by ``temperature``; one model step per token."""
        ids = self.ids(context)
        state = self._read(ids[:-1])
        token, out, text = int(ids[-1]), [], ""
        for _ in range(max_tokens):
            log_p, state = self.model.log_probs(torch.tensor([[token]], device=self.device), state,
                                                self.factor)  # [1, 1, V]
            token = next_token(log_p[0, 0], temperature, top_k, generator)
            out.append(token)
            text = continuation_text(self.vocab, context, out)
            if any(stop in text for stop in until):
                break
        for stop in until:
            text = text.split(stop)[0]
        return text


def continuation_text(vocab: Vocabulary, context: str, ids: list[int]) -> str:
    """The text of token ``ids`` generated after ``context``: a word run's words follow the context after a
    space (unless it ends in whitespace); characters and bytes follow it directly."""
    text = vocab.decode(ids)
    if vocab.level == "word" and context and not context[-1].isspace() and not text.startswith("\n"):
        return " " + text
    return text
