"""moglm: Mogrifier LSTM and other input-dependent recurrent language models for PyTorch."""

from .modules import LSTM, MogrifierLSTM, MultiplicativeLSTM
from .stack import RecurrentStack

__version__ = "0.1.0"

__all__ = ["LSTM", "MogrifierLSTM", "MultiplicativeLSTM", "RecurrentStack", "__version__"]
