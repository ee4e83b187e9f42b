"""moglm: Mogrifier LSTM and other input-dependent recurrent language models for PyTorch."""

from .modules import ARCHITECTURES, LSTM, MogrifierLSTM, MultiplicativeLSTM
from .modules_rnn import (
    GRU,
    RNN,
    DyckRNN,
    MogrifierGRU,
    MogrifierRNN,
    MultiMatrixLSTM,
    MultiMatrixRNN,
    MultiplicativeRNN,
)
from .stack import RecurrentStack

__version__ = "0.1.0"

__all__ = [
    "ARCHITECTURES",
    "GRU",
    "LSTM",
    "RNN",
    "DyckRNN",
    "MogrifierGRU",
    "MogrifierLSTM",
    "MogrifierRNN",
    "MultiMatrixLSTM",
    "MultiMatrixRNN",
    "MultiplicativeLSTM",
    "MultiplicativeRNN",
    "RecurrentStack",
    "__version__",
]
