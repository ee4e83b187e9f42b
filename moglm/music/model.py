"""The RNN-NADE (Krause thesis 2.6.2, eq. 2.64-2.65; Boulanger-Lewandowski et al. 2012) with any moglm recurrent
stack: an LSTM-NADE (thesis 4.8), an RNN-NADE, a Mogrifier-NADE ...

    e_t   = E x_{t-1}                          a linear embedding of the previous frame (zeros before the first)
    h_t   = stack(e_t, state)                  any architecture of moglm.modules, with its dropouts
    b_h^t = b_h + W_bh^h h_t                   (eq. 2.64)
    b_y^t = b_y + W_bh^y h_t                   (eq. 2.65)
    log P(x_t | x_<t) = NADE(x_t; b_h^t, b_y^t)   (eq. 2.58-2.63, :mod:`.nade`)

It keeps the stream-model contract (:mod:`moglm.evaluation.stream_model`) with frames in place of token ids:
``nll(inputs [T, B, D], targets [T, B, D], state) -> (nll [T, B], state)``, so dynamic evaluation's evaluator
adapts it unchanged. State is passed in and returned.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..model.architectures import MODEL_ARCHITECTURES, is_recurrent
from ..modules import StackState
from .nade import NADE


class NadeSequenceModel(nn.Module):
    """A recurrent stack whose state sets a NADE's biases at every frame (module docstring).

    ``visible``: units per frame (88 piano keys); ``embedding_size``: the linear embedding of a frame;
    ``nade_hidden``: the NADE's hidden units. Dropout: ``input_dropout`` on the embedding, the stack's
    ``inter_layer_dropout`` and ``state_dropout``, ``output_dropout`` on the stack's output, ``nade_dropout`` on the
    NADE's hidden units (one mask per frame)."""

    def __init__(
        self,
        hidden_size: int,
        num_layers: int = 2,
        architecture: str = "lstm",
        cell_options: dict[str, Any] | None = None,
        visible: int = 88,
        embedding_size: int | None = None,
        nade_hidden: int = 150,
        activation: str = "relu",
        input_dropout: float = 0.0,
        inter_layer_dropout: float = 0.0,
        state_dropout: float = 0.0,
        output_dropout: float = 0.0,
        nade_dropout: float = 0.0,
        backend: str = "auto",
        init: str = "torch",
    ) -> None:
        super().__init__()
        if not is_recurrent(architecture):
            raise ValueError(f"architecture must be a recurrent one of {sorted(MODEL_ARCHITECTURES)}, "
                             f"got {architecture!r}")
        self.architecture, self.hidden_size, self.visible = architecture, hidden_size, visible
        self.embedding_size = embedding_size or hidden_size
        self.input_dropout, self.output_dropout = input_dropout, output_dropout
        self.embedding = nn.Linear(visible, self.embedding_size)  # the thesis's "linear embedding layer"
        self.rnn = MODEL_ARCHITECTURES[architecture](
            self.embedding_size, hidden_size, num_layers, dropout=inter_layer_dropout, state_dropout=state_dropout,
            init=init, backend=backend, **(cell_options or {}))
        self.nade = NADE(visible, nade_hidden, activation, nade_dropout)
        self.condition = nn.Linear(hidden_size, nade_hidden + visible)  # [W_bh^h; W_bh^y], bias [b_h; b_y]

    @torch.no_grad()
    def init_output_bias(self, frequency: Tensor) -> None:
        """Start ``b_y`` at the logit of each unit's frequency ``[D]`` in the training frames, so training begins
        from the per-pitch marginals (about 4 of 88 keys sound at once) instead of a fair coin per key."""
        p = frequency.to(self.condition.bias).clamp(1e-4, 1 - 1e-4)  # [D]
        self.condition.bias[self.nade.hidden :] = torch.log(p) - torch.log1p(-p)

    def zero_state(self, batch: int) -> StackState:
        return self.rnn.zero_state(batch)

    def forward(self, inputs: Tensor, state: StackState | None = None) -> tuple[Tensor, Tensor, Tensor, StackState]:
        """The NADE biases of every frame, ``b_h`` ``[T, B, H_nade]`` and ``b_y`` ``[T, B, D]``, the stack's output
        ``[T, B, H]`` and the final state, from the previous frames ``inputs`` ``[T, B, D]``."""
        e = F.dropout(self.embedding(inputs), self.input_dropout, self.training)  # [T, B, E]
        outputs, state = self.rnn.forward_layers(e, state)  # each [T, B, H]
        h = F.dropout(outputs[-1], self.output_dropout, self.training)  # [T, B, H]
        b_h, b_y = self.condition(h).split([self.nade.hidden, self.visible], -1)  # eq. 2.64, 2.65
        return b_h, b_y, h, state

    def nll(self, inputs: Tensor, targets: Tensor, state: StackState | None = None,
            factor: float = 1.0) -> tuple[Tensor, StackState]:
        """Negative log-likelihood of every frame ``[T, B]`` of ``targets`` ``[T, B, D]`` given the previous frames
        ``inputs`` ``[T, B, D]`` and ``state``."""
        nll, _, state = self.nll_features(inputs, targets, state, factor)
        return nll, state

    def nll_features(self, inputs: Tensor, targets: Tensor, state: StackState | None = None,
                     factor: float = 1.0) -> tuple[Tensor, Tensor, StackState]:
        """:meth:`nll` and the stack's output ``[T, B, H]``."""
        b_h, b_y, h, state = self(inputs, state)
        return -self.nade.log_prob(targets, b_h, b_y, factor), h, state  # [T, B]

    @torch.no_grad()
    def sample(self, frames: int, prompt: Tensor | None = None, generator: torch.Generator | None = None,
               temperature: float = 1.0) -> Tensor:
        """``frames`` frames ``[frames, D]`` drawn one after another, each NADE unit by unit, continuing
        ``prompt`` ``[P, D]`` (default: from silence)."""
        was_training = self.training
        self.eval()
        try:
            device = self.embedding.weight.device
            previous = torch.zeros(1, 1, self.visible, device=device)  # [1, 1, D]
            state = None
            if prompt is not None and len(prompt):
                prompt = prompt.to(device=device, dtype=previous.dtype)
                _, _, _, state = self(torch.cat([previous[0], prompt[:-1]]).unsqueeze(1), state)
                previous = prompt[-1:].unsqueeze(1)
            out = []
            for _ in range(frames):
                b_h, b_y, _, state = self(previous, state)  # [1, 1, H_nade], [1, 1, D]
                previous = self.nade.sample(b_h, b_y, generator, temperature)  # [1, 1, D]
                out.append(previous[0, 0])
            return torch.stack(out) if out else torch.zeros(0, self.visible)  # [frames, D]
        finally:
            self.train(was_training)
