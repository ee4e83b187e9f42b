"""The run directory of a language model (``moglm train``): its typed config and its trained model."""

from __future__ import annotations

import torch

from ..data.vocabulary import Vocabulary
from ..errors import MoglmError
from ..model.language_model import LanguageModel
from ..runs import RunDirectory, load_group
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

    def load_model(
        self, which: str = "best", device: torch.device | str = "cpu"
    ) -> tuple[LanguageModel, RunConfig, Vocabulary]:
        """The model of checkpoint ``which`` (``best``: the weights that scored best on validation,
        averaged if averaging was on; ``last``: the latest raw training weights)."""
        config, vocab = self.load_config(), self.load_vocab()
        pointer = self.checkpoints.open(which)
        if pointer is None:
            raise MoglmError(f"{self.path}: no {which} checkpoint yet")
        model = build_model(config.model, len(vocab), self.model_info()["hidden_size"])
        weights = load_group(pointer["path"], pointer.get("weights", "model"))
        missing, unexpected = model.load_state_dict(weights, strict=False)
        if missing or unexpected:
            raise MoglmError(f"{pointer['path']}: weights do not fit the model ({(missing or unexpected)[0]})")
        return model.to(device), config, vocab
