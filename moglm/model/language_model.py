"""The language model: embedding -> sequence model (a recurrent stack, or a Transformer) -> output head.

Follows the Mogrifier paper's setup (section 3.3; docs/method.md "Embeddings and output", "Training recipe"):

* input embedding of size ``E = round(min(input_embedding_ratio, 1) * hidden)``;
* input dropout on the embeddings, inter-layer and state dropout inside the stack, output dropout on
  the stack output (and on the down-projection / MoS components); input, inter-layer and output masks
  are fresh at every time step, except that ``variational_input_dropout`` draws one input mask per
  sequence, shared by its steps (the thesis's mLSTM recipe, 3.5.2);
* skip-sum stacking (the output is the sum of all layers' outputs) or the last layer's output;
* a softmax with tied or untied output embedding, or a mixture of softmaxes.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..cells.initialisation import truncated_normal_
from ..modules import StackState
from .architectures import MODEL_ARCHITECTURES, is_recurrent
from .mixture_of_softmaxes import MixtureOfSoftmaxes
from .softmax import SoftmaxHead


def embedding_size(hidden_size: int, input_embedding_ratio: float) -> int:
    """``round(min(ratio, 1) * hidden)``, at least 1 (paper appendix A: ratio >= 1 means E = hidden)."""
    return max(1, int(round(min(input_embedding_ratio, 1.0) * hidden_size)))


class LanguageModel(nn.Module):
    """A recurrent language model over a vocabulary of ``vocab_size`` tokens.

    ``forward(tokens [T, B], state) -> (features [T, B, H], state)``; :meth:`nll` and :meth:`log_probs`
    add the output head. State is passed in and returned, as with torch.nn.LSTM.

    ``init`` initialises the recurrent stack: ``"torch"`` (default, as the modules) or ``"paper"`` (the
    original experiments' truncated normals, docs/method.md "Initialisation"), which the paper configs set.
    ``cell_options`` are the fields of ``MODEL_ARCHITECTURES[architecture].Options`` (a recurrent cell, or
    the segment-memory Transformer of :mod:`moglm.model.transformer`).
    """

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        num_layers: int = 2,
        architecture: str = "mogrifier",
        cell_options: dict[str, Any] | None = None,
        input_embedding_ratio: float = 1.0,
        tie_embeddings: bool = True,
        skip_sum: bool = True,
        mos_components: int = 1,
        input_dropout: float = 0.0,
        inter_layer_dropout: float = 0.0,
        state_dropout: float = 0.0,
        output_dropout: float = 0.0,
        backend: str = "auto",
        init: str = "torch",
        variational_input_dropout: bool = False,
    ) -> None:
        super().__init__()
        if architecture not in MODEL_ARCHITECTURES:
            raise ValueError(f"architecture must be one of {sorted(MODEL_ARCHITECTURES)}, got {architecture!r}")
        self.vocab_size = vocab_size
        self.architecture = architecture
        self.hidden_size = hidden_size
        self.embedding_size = embedding_size(hidden_size, input_embedding_ratio)
        self.skip_sum = skip_sum
        self.tie_embeddings = tie_embeddings
        self.input_dropout = input_dropout
        self.variational_input_dropout = variational_input_dropout
        self.output_dropout = output_dropout
        self.embedding = nn.Embedding(vocab_size, self.embedding_size)
        self.rnn = MODEL_ARCHITECTURES[architecture](
            self.embedding_size,
            hidden_size,
            num_layers,
            dropout=inter_layer_dropout,
            state_dropout=state_dropout,
            init=init,
            backend=backend,
            **(cell_options or {}),
        )
        if mos_components > 1:
            self.head: nn.Module = MixtureOfSoftmaxes(
                hidden_size, self.embedding_size, vocab_size, mos_components, output_dropout
            )
        else:
            self.head = SoftmaxHead(hidden_size, self.embedding_size, vocab_size, output_dropout)
        self.output_embedding = None if tie_embeddings else nn.Parameter(torch.empty(vocab_size, self.embedding_size))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = self.embedding_size**-0.5
        truncated_normal_(self.embedding.weight.data, std=std)
        if self.output_embedding is not None:
            truncated_normal_(self.output_embedding.data, std=std)

    @property
    def decoder_weight(self) -> Tensor:
        """The output embedding ``[V, E]``: the input embedding when tied."""
        return self.embedding.weight if self.output_embedding is None else self.output_embedding

    def zero_state(self, batch: int) -> StackState:
        """An all-zero recurrent state for ``batch`` streams."""
        return self.rnn.zero_state(batch)

    def forward(self, tokens: Tensor, state: StackState | None = None) -> tuple[Tensor, StackState]:
        """Features before the output head: ``[T, B, H]`` (after output dropout)."""
        x = self.embedding(tokens)  # [T, B, E]
        if self.variational_input_dropout and self.training and self.input_dropout > 0:
            keep = 1.0 - self.input_dropout  # one mask per sequence, shared by its steps (thesis 3.5.2)
            x = x * torch.bernoulli(x.new_full((1, *x.shape[1:]), keep)) / keep  # [T, B, E] * [1, B, E]
        elif self.training and self.input_dropout > 0:
            x = F.dropout(x, self.input_dropout, True)  # [T, B, E], a fresh mask per step
        outputs, state = self.rnn.forward_layers(x, state)  # each [T, B, H]
        h = torch.stack(outputs).sum(0) if self.skip_sum and len(outputs) > 1 else outputs[-1]  # [T, B, H]
        # no dropout call in eval mode, where it returns its input (a one-token step makes this call at every step)
        return (F.dropout(h, self.output_dropout, True) if self.training and self.output_dropout > 0 else h), state

    @property
    def reads_in_segments(self) -> bool:
        """True for the Transformer, whose predictions depend on where the stream is cut
        (:mod:`moglm.evaluation.stream_model`)."""
        return not is_recurrent(self.architecture)

    def nll(
        self, tokens: Tensor, targets: Tensor, state: StackState | None = None, factor: float = 1.0
    ) -> tuple[Tensor, StackState]:
        """Per-token negative log-likelihood ``[T, B]`` of ``targets`` given ``tokens`` (both ``[T, B]``)."""
        nll, _, state = self.nll_features(tokens, targets, state, factor)
        return nll, state

    def nll_features(
        self, tokens: Tensor, targets: Tensor, state: StackState | None = None, factor: float = 1.0
    ) -> tuple[Tensor, Tensor, StackState]:
        """:meth:`nll` and the features the output head read, ``[T, B, H]`` (the neural cache's keys)."""
        h, state = self(tokens, state)  # [T, B, H]
        nll = self.head.nll(h.flatten(0, 1), targets.flatten(), self.decoder_weight, factor)  # [T*B]
        return nll.view_as(targets), h, state

    def log_probs(
        self, tokens: Tensor, state: StackState | None = None, factor: float = 1.0
    ) -> tuple[Tensor, StackState]:
        """Next-token log-probabilities ``[T, B, V]``."""
        h, state = self(tokens, state)  # [T, B, H]
        return self.output_log_probs(h, factor), state

    def output_log_probs(self, features: Tensor, factor: float = 1.0) -> Tensor:
        """The output head on ``features`` ``[..., H]`` (from :meth:`forward`): log-probabilities ``[..., V]``."""
        lp = self.head.log_probs(features.reshape(-1, features.shape[-1]), self.decoder_weight, factor)  # [N, V]
        return lp.view(*features.shape[:-1], -1)

    @contextmanager
    def dropout_scaled(self, multiplier: float):
        """Temporarily multiply every dropout rate by ``multiplier`` (MC-dropout evaluation)."""
        saved = (self.input_dropout, self.output_dropout, self.rnn.dropout, self.rnn.state_dropout, self.head.dropout)
        try:
            self.input_dropout, self.output_dropout = saved[0] * multiplier, saved[1] * multiplier
            self.rnn.dropout, self.rnn.state_dropout = saved[2] * multiplier, saved[3] * multiplier
            self.head.dropout = saved[4] * multiplier
            yield self
        finally:
            self.input_dropout, self.output_dropout, self.rnn.dropout, self.rnn.state_dropout, self.head.dropout = saved


def count_parameters(model: nn.Module) -> int:
    """Number of distinct scalar parameters (a tied embedding counts once)."""
    return sum(p.numel() for p in model.parameters())
