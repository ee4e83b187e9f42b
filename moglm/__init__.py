"""moglm: Mogrifier LSTM and other input-dependent recurrent language models for PyTorch."""

from .modules import *  # noqa: F403 - the modules (moglm.LSTM, moglm.MogrifierLSTM ...) and ARCHITECTURES
from .modules import __all__ as _modules

__version__ = "0.1.0"

__all__ = [*_modules, "__version__"]
