"""The run directory of a language model (``moglm train``): its typed config and its trained model."""

from __future__ import annotations

import json
import math

import torch

from ..data.vocabulary import Vocabulary
from ..errors import MoglmError
from ..model.language_model import LanguageModel
from ..runs import RunDirectory
from .build import build_model
from .config import RunConfig, validate


class LanguageModelRun(RunDirectory):
    """A :class:`~moglm.runs.RunDirectory` whose config is a :class:`RunConfig`."""

    def load_config(self) -> RunConfig:
        config = self.read_config()
        if config.get("kind") == "music":
            raise MoglmError(f"{self.path} is a music run: use `moglm music evaluate`, `moglm music dyneval` or "
                             "`moglm sample`")
        return validate(config, str(self.config_path))

    def logit_factor(self) -> float:
        """The logit factor (inverse softmax temperature) ``moglm evaluate`` found, from ``results.json``, else 1;
        a damaged file is a one-line error, not a silent 1."""
        if not self.results_path.is_file():
            return 1.0
        try:
            factor = json.loads(self.results_path.read_text()).get("temperature", 1.0)
            if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor) \
                    or factor <= 0:
                raise ValueError(f"temperature {factor!r}")
            return float(factor)
        except (ValueError, TypeError, AttributeError, UnicodeDecodeError) as e:
            raise MoglmError(f"{self.results_path}: damaged ({type(e).__name__}: {e}); run `moglm evaluate "
                             f"{self.path}` to write it again") from None

    def load_model(
        self, which: str = "best", device: torch.device | str = "cpu"
    ) -> tuple[LanguageModel, RunConfig, Vocabulary]:
        """The model of checkpoint ``which`` (``best``: the weights that scored best on validation,
        averaged if averaging was on; ``last``: the latest raw training weights)."""
        config, vocab = self.load_config(), self.load_vocab()
        model = build_model(config.model, len(vocab), self.model_info()["hidden_size"])
        return self.load_weights(model, which).to(device), config, vocab
