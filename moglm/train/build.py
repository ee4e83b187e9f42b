"""Objects from a config: the corpus and the language model (sized by parameter budget when asked)."""

from __future__ import annotations

from ..data.corpus import Corpus, load_corpus
from ..errors import MoglmError
from ..model.language_model import LanguageModel
from ..model.mlstm_recipe import apply_recipe
from ..model.sizing import largest_hidden_size
from .config import DataConfig, ModelConfig


def load_data(cfg: DataConfig) -> Corpus:
    return load_corpus(cfg.path, cfg.format, cfg.files, tuple(cfg.split_fractions))


def build_model(cfg: ModelConfig, vocab_size: int, hidden_size: int | None = None) -> LanguageModel:
    """The language model of ``cfg``; ``hidden_size`` overrides the config's (a budget-resolved size)."""
    size = hidden_size or resolve_hidden_size(cfg, vocab_size)
    try:
        return _language_model(cfg, vocab_size, size)
    except (ValueError, TypeError) as e:
        raise MoglmError(f"model: {e}") from None


def _language_model(cfg: ModelConfig, vocab_size: int, hidden_size: int) -> LanguageModel:
    model = LanguageModel(
        vocab_size,
        hidden_size,
        num_layers=cfg.num_layers,
        architecture=cfg.architecture,
        cell_options=dict(cfg.cell),
        input_embedding_ratio=cfg.input_embedding_ratio,
        tie_embeddings=cfg.tie_embeddings,
        skip_sum=cfg.skip_sum,
        mos_components=cfg.mos_components,
        input_dropout=cfg.input_dropout,
        variational_input_dropout=cfg.variational_input_dropout,
        inter_layer_dropout=cfg.inter_layer_dropout,
        state_dropout=cfg.state_dropout,
        output_dropout=cfg.output_dropout,
        backend=cfg.backend,
        init=cfg.init,
    )
    if cfg.orthogonal_init is not None or cfg.forget_bias is not None or cfg.weight_norm:
        apply_recipe(model.rnn, cfg.orthogonal_init, cfg.forget_bias, cfg.weight_norm)
    return model


def resolve_hidden_size(cfg: ModelConfig, vocab_size: int) -> int:
    """The configured hidden size, or the largest whose model fits ``cfg.num_params``."""
    if cfg.hidden_size is not None:
        return cfg.hidden_size
    return largest_hidden_size(cfg.num_params, lambda h: _language_model(cfg, vocab_size, h))
