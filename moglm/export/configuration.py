"""The transformers config of an exported run: :class:`MoglmConfig`, model type ``"moglm"``.

It holds the run's ``[model]`` section as ``moglm_model`` (what :func:`moglm.runs.build.build_model` reads), the
resolved sizes (``vocab_size``, ``hidden_size``: the hidden size a parameter budget chose, from ``model.json``),
the logit factor (inverse softmax temperature) the run's final evaluation searched, and the vocabulary's level.
"""

from __future__ import annotations

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

