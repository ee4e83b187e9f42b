"""The transformers config of an exported run: :class:`MoglmConfig`, model type ``"moglm"``.

It holds the run's ``[model]`` section as ``moglm_model`` (what :func:`moglm.runs.build.build_model` reads), the
resolved sizes (``vocab_size``, ``hidden_size``: the hidden size a parameter budget chose, from ``model.json``),
the logit factor (inverse softmax temperature) the run's final evaluation searched, and the vocabulary's level.
"""

from __future__ import annotations

import sys
from typing import Any

from transformers import PretrainedConfig


class MoglmConfig(PretrainedConfig):
    """A moglm run's model as a transformers config (module docstring)."""

    model_type = "moglm"

    def __init__(self, vocab_size: int = 2, hidden_size: int = 16, num_hidden_layers: int = 2,
                 moglm_model: dict[str, Any] | None = None, logit_factor: float = 1.0, vocabulary_level: str = "word",
                 moglm_version: str | None = None, use_cache: bool = True, **kwargs: Any) -> None:
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.moglm_model = dict(moglm_model or {})
        self.logit_factor = logit_factor
        self.vocabulary_level = vocabulary_level
        self.moglm_version = moglm_version
        self.use_cache = use_cache
        kwargs["tie_word_embeddings"] = False  # a tied output embedding is moglm's own (no lm_head to tie)
        super().__init__(**kwargs)


def register_config() -> None:
    """Register model type ``"moglm"`` with ``AutoConfig`` (:mod:`moglm.transformers_registration` calls it)."""
    from transformers.models.auto.configuration_auto import AutoConfig

    AutoConfig.register(MoglmConfig.model_type, MoglmConfig, exist_ok=True)


def register_model() -> None:
    """Register model type ``"moglm"`` with ``AutoModelForCausalLM`` (:mod:`moglm.transformers_registration` calls
    it): the model class itself once it is imported, until then :class:`DeferredMoglmForCausalLM`, so that a
    process that uses only transformers' tokenizers never imports the model's code (transformers' modeling)."""
    from transformers.models.auto.modeling_auto import AutoModelForCausalLM

    modeling = sys.modules.get("moglm.export.modeling")
    model = getattr(modeling, "MoglmForCausalLM", None) or DeferredMoglmForCausalLM
    AutoModelForCausalLM.register(MoglmConfig, model, exist_ok=True)


class DeferredMoglmForCausalLM:
    """What ``AutoModelForCausalLM`` holds for model type ``"moglm"`` until the model is first loaded: its
    ``from_pretrained`` and ``_from_config`` import :class:`~moglm.export.modeling.MoglmForCausalLM` (which then
    takes this one's place) and call its own."""

    config_class = MoglmConfig

    @staticmethod
    def model_class() -> type:
        """The model class, imported now by name (as the registry's hooks are: the modeling module imports this
        one, so this one names it rather than importing it)."""
        from ..registry import load

        model = load("moglm.export.modeling:MoglmForCausalLM")
        register_model()
        return model

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any) -> Any:
        return cls.model_class().from_pretrained(*args, **kwargs)

    @classmethod
    def _from_config(cls, config: MoglmConfig, **kwargs: Any) -> Any:
        return cls.model_class()._from_config(config, **kwargs)
