"""The sequence models a :class:`~moglm.model.language_model.LanguageModel` can hold, by config name:
every recurrent architecture of :data:`moglm.modules.ARCHITECTURES`, and ``"transformer"``
(:class:`~moglm.model.transformer.Transformer`, a segment-memory Transformer read like a recurrence).

Each is constructed as ``cls(input_size, hidden_size, num_layers, *, dropout=..., state_dropout=...,
init=..., backend=..., **asdict(cls.Options(...)))`` and read with ``forward_layers(x, state)``.
"""

from __future__ import annotations

from ..modules import ARCHITECTURES
from .transformer import Transformer

MODEL_ARCHITECTURES: dict[str, type] = {**ARCHITECTURES, "transformer": Transformer}


def is_recurrent(architecture: str) -> bool:
    """Whether ``architecture`` is a recurrent stack (sparse dynamic evaluation needs its cells)."""
    return architecture in ARCHITECTURES
