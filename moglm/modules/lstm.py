"""The LSTM family: LSTM (a drop-in for torch.nn.LSTM), multiplicative LSTM and multi-matrix LSTM.

Each is a :class:`~moglm.modules.base.RecurrentModule` of one cell type. LSTM parameters carry
torch.nn.LSTM's exact names, so ``moglm.LSTM(...).load_state_dict(nn_lstm.state_dict())`` works.
The Mogrifier LSTM is in :mod:`moglm.modules.mogrifier`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..cells.lstm import LSTMCell
from ..cells.multi_matrix import MultiMatrixLSTMCell
from ..cells.multiplicative_integration import MultiplicativeIntegrationLSTMCell
from ..cells.multiplicative_lstm import MultiplicativeLSTMCell
from .base import RecurrentModule
from .options import CappedInputGateOption, MultiMatrixOption


class LSTM(RecurrentModule):
    """Multi-layer LSTM (the Mogrifier paper's section 2 cell), a drop-in for torch.nn.LSTM: same positional
    arguments, parameter names, initialisation (``init="torch"``), outputs and states. PackedSequence input
    gives PackedSequence output, as torch.nn.LSTM's."""

    @dataclass
    class Options(CappedInputGateOption):
        """Options of :class:`LSTM`."""

    cell_class = LSTMCell


class MultiplicativeLSTM(RecurrentModule):
    """Multi-layer multiplicative LSTM (Krause et al. 2016; Krause's thesis, eq. 3.5-3.9):
    ``m = (W_mx x) * (W_mh h_prev)`` replaces h_prev in the LSTM step. Not xLSTM's matrix-memory "mLSTM"."""

    @dataclass
    class Options(CappedInputGateOption):
        """Options of :class:`MultiplicativeLSTM`."""

    cell_class = MultiplicativeLSTMCell


class MultiplicativeIntegrationLSTM(RecurrentModule):
    """Multi-layer multiplicative-integration LSTM (MI-LSTM; Wu et al. 2016; Krause's thesis 2.4.3): each gate's
    pre-activation is ``alpha * (W_ih x) * (W_hh h) + beta_h * (W_hh h) + beta_x * (W_ih x) + b``, with learnt
    gating vectors (``mi_alpha_l0`` ...). Its time loop is the reference loop (no fused window)."""

    @dataclass
    class Options(CappedInputGateOption):
        """Options of :class:`MultiplicativeIntegrationLSTM`."""

    cell_class = MultiplicativeIntegrationLSTMCell


class MultiMatrixLSTM(RecurrentModule):
    """Multi-layer multi-matrix LSTM (mmLSTM, the student report's eq. 9-22): per gate, a softmax key over
    ``num_matrices`` shared recurrent matrices. ``hx``/``h_n`` are ``(h, c, key)``, key ``[L, B, 4K]`` (the
    i|f|j|o gates' keys); a zero key means the uniform one. ``num_matrices=1`` is exactly an LSTM."""

    @dataclass
    class Options(CappedInputGateOption, MultiMatrixOption):
        """Options of :class:`MultiMatrixLSTM`."""

    cell_class = MultiMatrixLSTMCell
