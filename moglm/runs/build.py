"""Objects from a config: the corpus and the language model (sized by parameter budget when asked)."""

from __future__ import annotations

from ..data.corpus import Corpus, load_corpus
from ..errors import MoglmError
from ..model.language_model import LanguageModel
from ..model.mlstm_recipe import apply_recipe
from ..model.sizing import largest_hidden_size
from .config import DataConfig, ModelConfig


def load_data(cfg: DataConfig) -> Corpus:
    training = cfg.tokenizer_training
    return load_corpus(cfg.path, cfg.format, cfg.files, tuple(cfg.split_fractions), source=cfg.source,
                       text_field=cfg.text_field, split_names=cfg.split_names, tokenizer=cfg.tokenizer,
                       train_tokenizer=None if training is None else (training.kind, training.vocab_size),
                       detokenize=cfg.detokenize)


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


def available_memory(device) -> int | None:
    """Bytes free for a new model on ``device``: the kernel's MemAvailable on CPU, the CUDA driver's free memory
    on a GPU (``None`` where unknown)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


#: memory per parameter to build and train a model: float32 weights, gradients and Adam's two moments (16 bytes)
#: and the initialisation's temporaries (building a 460M-parameter LSTM stack peaked at 41 bytes per parameter)
BYTES_PER_PARAMETER = 40


def check_fits(cfg: ModelConfig, vocab_size: int, hidden_size: int, device="cpu") -> int | None:
    """Refuse, in one line and before anything is allocated, a model whose training would not fit in memory:
    its parameters (counted on the meta device, for 1 and 2 layers and extrapolated to ``num_layers``) times
    :data:`BYTES_PER_PARAMETER`. Returns the estimated parameter count."""
    import torch

    def count(layers: int) -> int:
        with torch.device("meta"):
            model = _language_model(cfg.model_copy(update={"num_layers": layers}), vocab_size, hidden_size)
        return sum(p.numel() for p in model.parameters())

    try:
        one = count(1)
        params = one if cfg.num_layers == 1 else one + (cfg.num_layers - 1) * (count(2) - one)
    except Exception:  # noqa: BLE001 - an architecture that cannot be built on the meta device: no estimate
        return None
    free = available_memory(device)
    need = BYTES_PER_PARAMETER * params
    if free is not None and need > free:
        raise MoglmError(f"model: {params:,} parameters ({cfg.num_layers} layers of {hidden_size} units) need about "
                         f"{need / 2**30:,.1f} GiB to train, more than the {free / 2**30:,.1f} GiB free here; lower "
                         "model.num_layers, model.hidden_size or model.num_params")
    return params
