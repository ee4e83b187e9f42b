"""moglm's classes in transformers' Auto classes (:mod:`moglm.transformers_registration` calls these when
transformers imports the modules that define ``AutoConfig`` and ``AutoModelForCausalLM``)."""

from __future__ import annotations

import sys
from typing import Any

from .configuration import MoglmConfig


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
        from .modeling import MoglmForCausalLM

        register_model()
        return MoglmForCausalLM

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any) -> Any:
        return cls.model_class().from_pretrained(*args, **kwargs)

    @classmethod
    def _from_config(cls, config: MoglmConfig, **kwargs: Any) -> Any:
        return cls.model_class()._from_config(config, **kwargs)
