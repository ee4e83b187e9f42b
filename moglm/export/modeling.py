"""The transformers causal LM of an exported run: :class:`MoglmForCausalLM`, a ``PreTrainedModel`` and
``GenerationMixin`` around moglm's own :class:`~moglm.model.language_model.LanguageModel`, whose cache is the
recurrent state.

* ``logits`` are the model's next-token log-probabilities at the run's logit factor (the softmax temperature its
  final evaluation searched; ``config.logit_factor``), ``[B, T, V]``: a softmax of them is moglm's distribution,
  for a mixture of softmaxes too, so they equal what ``moglm evaluate`` scores.
* ``cache`` (transformers 5's name; ``past_key_values`` is accepted as well) is a :class:`RecurrentCache`: the
  state after every token read so far (a recurrent stack's state, or a Transformer's segment memory), fixed in
  size. Passing it back reads on from there, so a long text can be read in chunks, and ``generate()`` reads
  the prompt once and then one token per step, never the prefix again.
* ``attention_mask``: each row reads only its tokens marked 1 (left or right padding is skipped, not read), and
  goes on from its own state; the outputs at the padded positions are those of zero features.
* ``labels``: the mean next-token cross-entropy of ``labels[:, 1:]`` (``-100`` is ignored), as every causal LM
  in transformers.

Everything is float32 as trained; ``model.double()`` works as in PyTorch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
import transformers
from torch import Tensor
from transformers import GenerationMixin, PreTrainedModel
from transformers.utils import ModelOutput

from ..evaluation.stream_model import join_state_rows, state_rows
from ..model.language_model import LanguageModel
from ..runs.build import build_model
from ..runs.config import ModelConfig
from .configuration import MoglmConfig


class RecurrentCache:
    """``generate()``'s cache: the model's state after ``seen`` tokens (module docstring). Each forward pass
    returns a new one, so one cache can be continued in several ways."""

    is_compileable = False  # transformers: no static shapes to compile generation around
    is_linear = (True,)  # transformers 5: a state of fixed size, no key/value length to slice the prompt by

    def __init__(self, state: Any, seen: int) -> None:
        self.state = state
        self.seen = seen

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens read so far (transformers' name for it)."""
        return self.seen


@dataclass
class MoglmCausalLMOutput(ModelOutput):
    """``loss`` (with ``labels``), ``logits`` ``[B, T, V]`` (log-probabilities) and ``cache`` (with ``use_cache``)."""

    loss: Tensor | None = None
    logits: Tensor | None = None
    cache: RecurrentCache | None = None


def language_model(config: MoglmConfig) -> LanguageModel:
    """The run's :class:`LanguageModel` from ``config`` (random weights until loaded). The time-loop backend
    is ``auto`` whatever the run trained with: that choice is the training machine's."""
    model = {**config.moglm_model, "hidden_size": config.hidden_size, "num_params": None, "backend": "auto"}
    return build_model(ModelConfig(**model), config.vocab_size, config.hidden_size)


def check_parameter_names(model: LanguageModel) -> None:
    """Refuse, under transformers 4, a model with a parameter whose name holds ``beta`` or ``gamma`` (the MI-LSTM's
    ``mi_beta_h``): transformers 4 renames such keys (to ``bias``, ``weight``) when it loads a checkpoint, and the
    parameter would be left at its initial value."""
    if int(transformers.__version__.split(".")[0]) >= 5:
        return
    renamed = [name for name, _ in model.named_parameters() if "beta" in name or "gamma" in name]
    if renamed:
        raise ValueError(f"this model's parameter {renamed[0]!r} would be renamed by transformers "
                         f"{transformers.__version__} on loading: use transformers 5 or later")


class MoglmPreTrainedModel(PreTrainedModel):
    """The transformers base of moglm's exported models."""

    config_class = MoglmConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _is_stateful = True  # transformers: no assisted generation (a state cannot be rolled back)
    _no_split_modules: list[str] = []

    def _init_weights(self, module: torch.nn.Module) -> None:
        """Nothing: moglm's constructor initialises its weights, and an export's come from its file."""


class MoglmForCausalLM(MoglmPreTrainedModel, GenerationMixin):
    """A moglm run as a transformers causal LM (module docstring)."""

    def __init__(self, config: MoglmConfig) -> None:
        super().__init__(config)
        self.model = language_model(config)
        check_parameter_names(self.model)
        self.post_init()

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.model.embedding

    def get_output_embeddings(self) -> None:
        return None  # the output head reads the (tied or own) output embedding itself

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        """transformers' generate() makes no key/value cache: the model returns its own (:class:`RecurrentCache`)."""
        return False

    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                cache: RecurrentCache | None = None, past_key_values: RecurrentCache | None = None,
                labels: Tensor | None = None, use_cache: bool | None = None, return_dict: bool | None = None,
                logits_to_keep: int | Tensor = 0, inputs_embeds: Tensor | None = None,
                **kwargs: Any) -> MoglmCausalLMOutput | tuple:
        """Next-token log-probabilities of ``input_ids`` ``[B, T]`` after ``cache`` (module docstring);
        ``logits_to_keep``: only the last n positions' (or those of an index tensor)."""
        if input_ids is None or inputs_embeds is not None:
            raise ValueError("MoglmForCausalLM reads token ids: give input_ids (inputs_embeds are not supported)")
        cache = cache if cache is not None else past_key_values
        use_cache = self.config.use_cache if use_cache is None else use_cache
        features, state = self._read(input_ids, attention_mask, None if cache is None else cache.state)  # [B, T, H]
        if isinstance(logits_to_keep, Tensor):
            features = features[:, logits_to_keep]  # [B, K, H]
        elif logits_to_keep:
            features = features[:, -logits_to_keep:]  # [B, K, H]
        logits = self.model.output_log_probs(features, self.config.logit_factor)  # [B, K, V]
        loss = None
        if labels is not None:
            if logits.shape[1] != input_ids.shape[1]:
                raise ValueError("labels need the logits of every position (logits_to_keep=0)")
            loss = F.nll_loss(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten().to(logits.device),
                              ignore_index=-100)
        seen = (0 if cache is None else cache.seen) + input_ids.shape[1]
        out = MoglmCausalLMOutput(loss=loss, logits=logits, cache=RecurrentCache(state, seen) if use_cache else None)
        return out if (self.config.return_dict if return_dict is None else return_dict) else out.to_tuple()

    def _read(self, input_ids: Tensor, attention_mask: Tensor | None, state: Any) -> tuple[Tensor, Any]:
        """Features ``[B, T, H]`` of ``input_ids`` ``[B, T]`` and the state after them: one pass for the batch,
        or, where the mask has zeros, one pass per row over its marked tokens."""
        if attention_mask is None or bool(attention_mask.all()):
            features, state = self.model(input_ids.t(), state)  # [T, B, H]
            return features.transpose(0, 1), state
        rows, read = [], []
        for b in range(input_ids.shape[0]):
            marked = attention_mask[b].bool()  # [T]
            row = state_rows(state, torch.tensor([b]))
            h = None
            if marked.any():
                h, row = self.model(input_ids[b, marked].view(-1, 1), row)  # [T_b, 1, H]
            rows.append(row)
            read.append((marked, h))
        size = next(h.shape[-1] for _, h in read if h is not None) if any(h is not None for _, h in read) \
            else self.config.hidden_size
        features = torch.zeros(*input_ids.shape, size, dtype=self.dtype, device=input_ids.device)  # [B, T, H]
        for b, (marked, h) in enumerate(read):
            if h is not None:
                features[b, marked] = h[:, 0].to(features.dtype)
        return features, join_state_rows(rows)

    def prepare_inputs_for_generation(self, input_ids: Tensor, cache: RecurrentCache | None = None,
                                      past_key_values: RecurrentCache | None = None,
                                      attention_mask: Tensor | None = None, use_cache: bool = True,
                                      **kwargs: Any) -> dict[str, Any]:
        """The tokens the cache has not read yet (the whole prompt at first, then the last token), with their
        mask; without a cache (``use_cache=False``) every token, read again from a zero state."""
        cache = cache if cache is not None else past_key_values
        if cache is not None and use_cache:
            if cache.seen >= input_ids.shape[1]:
                raise ValueError(f"the cache has read {cache.seen} tokens: input_ids must hold them and at least one "
                                 f"more, got {input_ids.shape[1]}")
            input_ids = input_ids[:, cache.seen:]
            attention_mask = None if attention_mask is None else attention_mask[:, cache.seen:]
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "use_cache": use_cache,
                  "cache": cache if use_cache else None}
        if "logits_to_keep" in kwargs:
            inputs["logits_to_keep"] = kwargs["logits_to_keep"]
        return inputs

    def _update_model_kwargs_for_generation(self, outputs: MoglmCausalLMOutput, model_kwargs: dict[str, Any],
                                            *args: Any, **kwargs: Any) -> dict[str, Any]:
        model_kwargs = super()._update_model_kwargs_for_generation(outputs, model_kwargs, *args, **kwargs)
        model_kwargs["cache"] = outputs.cache  # under the name this forward reads, in every transformers version
        return model_kwargs

    def _reorder_cache(self, cache: RecurrentCache, beam_idx: Tensor) -> RecurrentCache:
        """Beam search: the states of the beams kept."""
        return RecurrentCache(state_rows(cache.state, beam_idx), cache.seen)
