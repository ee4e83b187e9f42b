"""Sparse dynamic evaluation (Krause thesis 4.6, eq. 4.8): adapt a small matrix, not the network.

A zero-initialised adaptation matrix ``M`` (``H x H``) transforms ``H`` chosen hidden units of a layer
at every time step, ``h'_t = h_t + M h_t``, and ``h'_t`` *replaces* ``h_t``: it is both the layer's
output (the next layer's input, the softmax's features) and the ``h_{t-1}`` of the layer's next step
(the thesis: "propagated throughout the network via both recurrent and feed-forward connections").
Only ``M`` is adapted. The units are the first ``H`` of each adapted layer (hidden units are
exchangeable, so any fixed subset is as good: the thesis calls it "an arbitrary subset").

Where M acts: inside the recurrence, so it cannot be a wrapper around the model's outputs. It is a
:class:`AdaptedCell` wrapped around the layer's cell, installed (:func:`install`) on a private *working
copy* of the model: ``step`` runs the wrapped cell's step and rewrites
``h`` (the output and ``state[0]``, which by the cell contract is h). Shared code is unchanged. On CPU
such a layer runs the compiled window, which applies M after every step inside its loop (the wrapper's
``output_adaptation()``, part of the cell contract); elsewhere it runs the reference recurrence.

``M`` is ``[H, H]`` (one matrix for every row of the batch: gradient statistics, one stream) or
``[B, H, H]`` (one per stream: each stream adapts its own matrix, the mini-batching that motivated the
sparse variant in the thesis).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..cells.base import Cell, Params, State
from ..errors import MoglmError
from ..model.language_model import LanguageModel


@dataclass(frozen=True)
class SparseSpec:
    """``units``: H, the adapted hidden units per layer (capped at the hidden size); ``layers``: which
    layers get a matrix (``None``: all)."""

    units: int = 100
    layers: tuple[int, ...] | None = None

    def resolve(self, model: LanguageModel) -> tuple[int, tuple[int, ...]]:
        stack = model.rnn
        if not hasattr(stack, "cells"):
            raise MoglmError("sparse dynamic evaluation adapts a recurrent layer's hidden state, and this model has "
                             "no recurrent layers: use full dynamic evaluation (--adapt selects the parameters)")
        if self.units < 1:
            raise MoglmError(f"sparse dynamic evaluation: units must be >= 1, got {self.units}")
        layers = tuple(range(stack.num_layers)) if self.layers is None else tuple(self.layers)
        for k in layers:
            if not 0 <= k < stack.num_layers:
                raise MoglmError(f"sparse dynamic evaluation: no layer {k} (the model has {stack.num_layers})")
        if not layers:
            raise MoglmError("sparse dynamic evaluation: no layers to adapt")
        return min(self.units, min(stack.cells[k].hidden_size for k in layers)), layers

    def names(self, model: LanguageModel) -> list[str]:
        """Names of the adaptation matrices (the keys of their cached statistics)."""
        return [f"sparse_M_l{k}" for k in self.resolve(model)[1]]

    def as_dict(self, model: LanguageModel) -> dict:
        units, layers = self.resolve(model)
        return {"units": units, "layers": list(layers)}


class AdaptedCell(Cell):
    """``inner``'s step followed by ``h[:, :H] += M h[:, :H]`` (eq. 4.8) on output and carried h."""

    def __init__(self, inner: Cell, matrix: Tensor) -> None:  # matrix: [H, H] or [B, H, H]
        super().__init__(inner.input_size, inner.hidden_size, inner.bias)
        self.inner = inner
        self.matrix = matrix
        self.units = matrix.shape[-1]
        self.state_names = inner.state_names

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        return self.inner.parameter_shapes()

    def reset_parameters(self, params: Params) -> None:
        self.inner.reset_parameters(params)

    def state_sizes(self) -> tuple[int, ...]:
        return self.inner.state_sizes()

    def zero_state(self, batch: int, like: Tensor) -> State:
        return self.inner.zero_state(batch, like)

    def step(self, params: Params, x: Tensor, state: State) -> tuple[Tensor, State]:
        h, state = self.inner.step(params, x, state)  # h: [B, hidden]
        sub = h[:, : self.units]  # [B, H]
        if self.matrix.dim() == 2:
            delta = sub @ self.matrix.t()  # [B, H]: (M h) per row
        else:
            delta = torch.bmm(self.matrix, sub.unsqueeze(-1)).squeeze(-1)  # [B, H]: each row its own M
        h = torch.cat([sub + delta, h[:, self.units :]], dim=1)  # [B, hidden]
        return h, (h, *state[1:])

    def output_adaptation(self) -> tuple[Cell, Tensor]:
        """``(inner cell, M)`` (the cell contract's :meth:`~moglm.cells.base.Cell.output_adaptation`): the
        recurrence runs the inner cell's compiled window with ``h + M h`` after every step where it can
        (:func:`moglm.recurrence.run_layer`), else this cell's step."""
        return self.inner, self.matrix

    def __getattr__(self, name: str):  # options of the wrapped cell (rounds, capped_input_gate ...)
        if name == "inner" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.inner, name)


def zero_matrices(model: LanguageModel, spec: SparseSpec, streams: int | None = None) -> list[Tensor]:
    """Zero adaptation matrices, one per adapted layer: ``[H, H]`` shared, or ``[streams, H, H]``."""
    units, layers = spec.resolve(model)
    like = next(model.parameters())
    shape = (units, units) if streams is None else (streams, units, units)
    return [like.new_zeros(shape).requires_grad_() for _ in layers]


def install(model: LanguageModel, spec: SparseSpec, matrices: list[Tensor]) -> None:
    """Make ``model``'s adapted layers apply ``matrices`` (from :func:`zero_matrices`) from now on.
    This changes ``model``: install on a working copy (:func:`.adapted.adapted_tensors` does)."""
    stack = model.rnn
    _, layers = spec.resolve(model)
    if len(matrices) != len(layers):
        raise ValueError(f"expected {len(layers)} adaptation matrices, got {len(matrices)}")
    for k, m in zip(layers, matrices):
        stack.cells[k] = AdaptedCell(stack.cells[k], m)
    # the compiled windows apply M inside the loop; elsewhere (CUDA, no compiler) these layers run the reference loop
