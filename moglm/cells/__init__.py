"""Cells: one time step of one recurrent layer each, behind the contract of :mod:`moglm.cells.base`."""

from .base import Cell
from .dyck_rnn import DyckRNNCell
from .gru import GRUCell
from .lstm import LSTMCell
from .mogrifier import MogrifierLSTMCell, mogrify
from .mogrifier_variants import MogrifierGRUCell, MogrifierRNNCell
from .multi_matrix import MultiMatrixLSTMCell, MultiMatrixRNNCell
from .multiplicative_integration import MultiplicativeIntegrationLSTMCell
from .multiplicative_lstm import MultiplicativeLSTMCell
from .rnn import MultiplicativeRNNCell, RNNCell

__all__ = [
    "Cell",
    "DyckRNNCell",
    "GRUCell",
    "LSTMCell",
    "MogrifierGRUCell",
    "MogrifierLSTMCell",
    "MogrifierRNNCell",
    "MultiMatrixLSTMCell",
    "MultiMatrixRNNCell",
    "MultiplicativeIntegrationLSTMCell",
    "MultiplicativeLSTMCell",
    "MultiplicativeRNNCell",
    "RNNCell",
    "mogrify",
]
