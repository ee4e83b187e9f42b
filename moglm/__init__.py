"""moglm: Mogrifier LSTM and other input-dependent recurrent language models for PyTorch."""

from .modules import ARCHITECTURES, LSTM, MogrifierLSTM, MultiplicativeLSTM
from .stack import RecurrentStack

__version__ = "0.1.0"

__all__ = ["ARCHITECTURES", "LSTM", "MogrifierLSTM", "MultiplicativeLSTM", "RecurrentStack", "__version__"]
