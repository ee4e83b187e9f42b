"""The GRU (Cho et al. 2014), a drop-in for torch.nn.GRU. The Mogrifier GRU is in :mod:`moglm.modules.mogrifier`."""

from __future__ import annotations

from dataclasses import dataclass

from ..cells.gru import GRUCell
from .base import RecurrentModule


class GRU(RecurrentModule):
    """Multi-layer GRU, a drop-in for torch.nn.GRU: torch's positional arguments, r/z/n step and parameter
    names. ``init="paper"`` gives the update gate the LSTM forget gate's bias mean 1."""

    @dataclass
    class Options:
        """The GRU has no options beyond the stack's."""

    cell_class = GRUCell
