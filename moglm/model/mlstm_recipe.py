"""The thesis's mLSTM recipe for the recurrent weights (Krause thesis 3.5.1), as options of any recurrent
language model: scaled orthogonal initialisation of the hidden weights (Saxe et al. 2013), an initial
forget-gate bias, and weight normalisation of the recurrent weights (Salimans and Kingma 2016). The
optimiser half of the recipe (Adam, a learning rate decaying linearly) is the training config's.

The *hidden* (recurrent) weights are the matrices that act on the carried state: ``weight_hh`` of every
layer (each gate's ``[H, H]`` block separately) and the multiplicative LSTM's ``weight_mh``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import parametrizations

from ..cells.lstm import LSTMCell

RECURRENT = ("weight_hh", "weight_mh")


def recurrent_weights(stack: nn.Module) -> list[str]:
    """Names of the stack's hidden weights (``weight_hh_l0``, ``weight_mh_l0``, ...)."""
    cells = getattr(stack, "cells", None)
    if cells is None:
        raise ValueError("the mLSTM recipe's options need a recurrent model (this one has no recurrent weights)")
    return [f"{name}_l{layer}" for layer, cell in enumerate(cells) for name in cell.parameter_shapes()
            if name in RECURRENT]


@torch.no_grad()
def orthogonal_recurrent_(stack: nn.Module, gain: float = 1.0) -> None:
    """Each hidden weight's ``[H, H]`` blocks (one per gate) set to a random orthogonal matrix times ``gain``."""
    for name in recurrent_weights(stack):
        weight = getattr(stack, name)  # [G * H, H]
        size = weight.shape[1]
        for block in weight.split(size, dim=0):  # G x [H, H]
            nn.init.orthogonal_(block, gain=gain)


@torch.no_grad()
def forget_bias_(stack: nn.Module, value: float) -> None:
    """The forget gate's bias (the second of the i, f, j, o blocks) set to ``value``: all of it on ``bias_ih``,
    ``bias_hh``'s block zeroed (the initial forget gate is sigmoid(value))."""
    for layer, cell in enumerate(stack.cells):
        if not isinstance(cell, LSTMCell):
            raise ValueError(f"forget_bias needs LSTM gates; layer {layer} is a {type(cell).__name__}")
        if not cell.bias:
            raise ValueError("forget_bias needs the layers' biases (bias=True)")
        h = cell.hidden_size
        getattr(stack, f"bias_ih_l{layer}")[h : 2 * h] = value
        getattr(stack, f"bias_hh_l{layer}")[h : 2 * h] = 0.0


def weight_norm_recurrent(stack: nn.Module) -> None:
    """Weight normalisation of every hidden weight: ``w = g * v / ||v||`` per row (torch's parametrisation;
    the stack reads the weight through it, so every backend trains ``g`` and ``v``)."""
    for name in recurrent_weights(stack):
        parametrizations.weight_norm(stack, name, dim=0)


def apply_recipe(stack: nn.Module, orthogonal_gain: float | None = None, forget_bias: float | None = None,
                 weight_norm: bool = False) -> None:
    """Initialise (then parametrise) ``stack``'s recurrent weights as the options say; nothing when all are off."""
    if orthogonal_gain is not None:
        orthogonal_recurrent_(stack, orthogonal_gain)
    if forget_bias is not None:
        forget_bias_(stack, forget_bias)
    if weight_norm:
        weight_norm_recurrent(stack)
