"""Cells: one time step of one recurrent layer each, behind the contract of :mod:`moglm.cells.base`."""

from .base import Cell
from .lstm import LSTMCell
from .mogrifier import MogrifierLSTMCell, mogrify
from .multiplicative_lstm import MultiplicativeLSTMCell

__all__ = ["Cell", "LSTMCell", "MogrifierLSTMCell", "MultiplicativeLSTMCell", "mogrify"]
