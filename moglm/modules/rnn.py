"""The Elman RNN family: RNN (a drop-in for torch.nn.RNN), multiplicative RNN, multi-matrix RNN and Dyck-RNN.

Each is a :class:`~moglm.modules.base.RecurrentModule` of one cell type from :mod:`moglm.cells`; they
return h_n as a tensor (a tuple for the multi-matrix RNN), like torch.nn.RNN. Those with a nonlinearity
take it positionally after ``num_layers``, as torch.nn.RNN does. The Mogrifier RNN is in
:mod:`moglm.modules.mogrifier`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..cells.dyck_rnn import DyckRNNCell, bracket_embedding_table
from ..cells.multi_matrix import MultiMatrixRNNCell
from ..cells.rnn import MultiplicativeRNNCell, RNNCell
from .base import RecurrentModule
from .options import MultiMatrixOption, NonlinearityOption


class RNN(RecurrentModule):
    """Multi-layer Elman RNN (Krause's thesis, eq. 2.4-2.5), a drop-in for torch.nn.RNN:
    ``h = tanh(W_ih x + b_ih + W_hh h_prev + b_hh)``, torch.nn.RNN's positional arguments and names."""

    @dataclass
    class Options(NonlinearityOption):
        """Options of :class:`RNN`."""

    cell_class = RNNCell
    positional_options = ("nonlinearity",)


class MultiplicativeRNN(RecurrentModule):
    """Multi-layer multiplicative RNN (Sutskever et al. 2011; Krause's thesis, eq. 2.26-2.28):
    ``m = (W_mx x) * (W_mh h_prev)``, ``h = tanh(W_ih x + b_ih + W_hh m + b_hh)``."""

    @dataclass
    class Options(NonlinearityOption):
        """Options of :class:`MultiplicativeRNN`."""

    cell_class = MultiplicativeRNNCell
    positional_options = ("nonlinearity",)


class MultiMatrixRNN(RecurrentModule):
    """Multi-layer multi-matrix RNN (mmRNN, the student report's eq. 6-8): a softmax key over ``num_matrices``
    shared transition matrices, carried in the state. ``hx``/``h_n`` are ``(h, key)``, key ``[L, B, K]``;
    a zero key means the uniform one. ``num_matrices=1`` is exactly :class:`RNN`."""

    @dataclass
    class Options(NonlinearityOption, MultiMatrixOption):
        """Options of :class:`MultiMatrixRNN`."""

    cell_class = MultiMatrixRNNCell
    positional_options = ("nonlinearity",)


class DyckRNN(RecurrentModule):
    """Multi-layer Dyck-RNN (the student report's section 4.2): h is a stack (index 0 on top) pushed or
    popped by an input gate through fixed shift matrices, no nonlinearity.

    The report uses one layer, H = m for depth-m brackets, no biases and a fixed 1-d embedding
    (``bracket_embedding(k)``); its variant learns a 2-d embedding with H = 2m
    (``bracket_embedding(k, learned=True)`` into ``DyckRNN(2, 2 * m)``). ``init="paper"`` starts the biases
    at zero, so that a biased cell starts as the report's equations.
    """

    @dataclass
    class Options:
        """The Dyck-RNN has no options beyond the stack's."""

    cell_class = DyckRNNCell

    @staticmethod
    def bracket_embedding(
        num_types: int,
        learned: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> nn.Embedding:
        """Embedding of 2k bracket tokens (ids 0..k-1 open, k..2k-1 the matching close). ``learned=False``:
        the report's frozen hand-set 1-d values (open +1..+k, close -1..-k); ``learned=True``: its
        section 6.2 variant, a trainable randomly initialised 2-d embedding (use with H = 2m)."""
        table = bracket_embedding_table(num_types, dtype=dtype)  # [2k, 1]; validates num_types
        if learned:
            return nn.Embedding(2 * num_types, 2, device=device, dtype=dtype)
        return nn.Embedding.from_pretrained(table.to(device=device), freeze=True)
