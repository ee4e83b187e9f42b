"""moglm: Mogrifier LSTM and other input-dependent recurrent language models for PyTorch."""

from .modules import *  # noqa: F403 - the modules (moglm.LSTM, moglm.MogrifierLSTM ...) and ARCHITECTURES
from .modules import __all__ as _modules
from .transformers_registration import install as _install_export_hook

__version__ = "0.1.0"

__all__ = [*_modules, "TrainedRun", "__version__", "load_run"]

_install_export_hook()  # model type "moglm" in transformers' Auto classes, once transformers is imported


def __getattr__(name: str):
    """``moglm.load_run`` (and ``TrainedRun``) are imported on first use: they need the training extras
    (pydantic, safetensors), which the modules alone do not."""
    if name in ("load_run", "TrainedRun"):
        from .runs import language_model

        return getattr(language_model, name)
    raise AttributeError(f"module 'moglm' has no attribute {name!r}")
