"""Dynamic evaluation of a Hugging Face causal LM (Krause thesis 6.3: GPT-2 out of domain): ``moglm dyneval
--hf PATH_OR_NAME --text FILE`` and :func:`dyneval_hf`.

The model is read through a :class:`~moglm.evaluation.context_window.ContextWindowLM` (segments of n tokens,
each conditioned on up to ``context`` earlier tokens), so the one dynamic-evaluation loop, its update rules,
divergence guard, search and the neural cache apply unchanged. As in 6.3.2:

* the thesis adapted all but GPT-2's tied input/output embedding: that is the default selection here
  (:class:`~.adapted.ParameterSelection` with ``embeddings=False``; ``--adapt`` / ``--freeze`` choose others);
* scores are reported per token and, from the text's character and byte counts, in bits per character and
  per byte, so models with different tokenisers compare. The text is encoded after a beginning-of-text
  token (the tokenizer's BOS, else its EOS, GPT-2's ``<|endoftext|>``) so that every token of the text is
  predicted; a tokenizer with neither predicts all but the first, and the counts cover what was predicted;
* RMS statistics and the search use held-out text of the model's own domain (``stats_text``,
  ``search_text``), never the text being scored, which keeps the evaluation out of domain.

``transformers`` is an optional extra (``pip install 'moglm[hf]'``), imported only here. Models load from a
local directory or the local cache only (``local_files_only``), from safetensors only, with no remote code:
loading never executes code from the model's files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ..atomic import atomic_write_text
from ..data.tokenizer import first_unknown, uncovered_message
from ..errors import MoglmError
from ..evaluation.context_window import ContextWindowLM, max_positions
from ..evaluation.scores import Scores
from .adapted import ParameterSelection
from .evaluate import DEFAULT_MARGIN, DynamicResult, dynamic_evaluate, static_pass
from .statistics import StatisticsSettings, gradient_rms
from .update_rules import Hyperparameters, uses_rms
from .with_cache import CACHE_SIZE, CacheReport, mixed_scores, stream_targets, tune

#: the thesis's choice for GPT-2: every parameter but the embeddings
NO_EMBEDDINGS = ParameterSelection(embeddings=False)


def load_causal_lm(name_or_path: str, device: str | torch.device = "cpu", dtype: torch.dtype | None = None):
    """``(model, tokenizer)`` of a local Hugging Face causal LM, in eval mode; one-line errors."""
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging
    except ImportError:
        raise MoglmError("--hf needs the transformers package: pip install 'moglm[hf]'") from None
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    kwargs: dict[str, Any] = {"local_files_only": True, "trust_remote_code": False}
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(name_or_path, use_safetensors=True,
                                                     **({"dtype": dtype} if dtype else {}), **kwargs)
    except Exception as e:  # noqa: BLE001 - a damaged directory fails in many ways (truncated or mismatched
        # weights, a corrupt tokenizer.json): each is one line naming the directory, never a traceback
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise MoglmError(f"{name_or_path}: cannot load a causal LM with its tokenizer from a local directory or "
                         f"the local cache (safetensors weights only): {first}") from None
    return model.to(device).eval(), tokenizer


@dataclass
class EncodedText:
    """Token ids of a text (after a beginning-of-text token when the tokenizer has one) and the characters
    and bytes of what the predicted tokens spell."""

    ids: np.ndarray
    characters: int
    bytes: int

    def scores(self, losses: torch.Tensor) -> Scores:
        """Scores of per-token losses of every predicted token, with the text's counts."""
        return Scores(float(losses.double().sum()), losses.numel(), None, self.characters, self.bytes)


def encode_text(tokenizer, text: str, what: str = "text") -> EncodedText:
    if not text:
        raise MoglmError(f"the {what} is empty")
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    _check_encodable(tokenizer, text, ids, what)
    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    if start is not None:
        predicted = text
        ids = [start] + ids
    else:
        predicted = tokenizer.decode(ids[1:])
    if len(ids) < 2:
        raise MoglmError(f"the {what} is too short: it encodes to {len(ids)} token(s)")
    return EncodedText(np.asarray(ids, dtype=np.int64), len(predicted), len(predicted.encode("utf-8")))


def _check_encodable(tokenizer, text: str, ids: list[int], what: str) -> None:
    """A one-line error when the tokenizer has no token for part of ``text`` (it becomes the unknown token,
    which a model cannot be scored on), naming the first such piece and where it starts."""
    if not ids:
        raise MoglmError(f"the tokenizer cannot encode the {what}: it gives no tokens for {text[:20]!r}")
    unk = tokenizer.unk_token_id
    if unk is None or unk in (tokenizer.eos_token_id, tokenizer.bos_token_id) or unk not in ids:
        return  # GPT-2's unknown token is its <|endoftext|>: a byte-level tokenizer encodes everything
    try:
        offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        span = first_unknown(ids, [tuple(o) for o in offsets], unk)
    except (NotImplementedError, KeyError, IndexError, TypeError, ValueError):  # a slow tokenizer has no offsets
        raise MoglmError(f"the tokenizer cannot encode the {what}: token {ids.index(unk)} becomes its unknown token "
                         f"{tokenizer.unk_token!r}") from None
    raise MoglmError(uncovered_message(what, text, span, 0, tokenizer.unk_token))


def read_text(path: str | Path, what: str) -> str:
    p = Path(path)
    if not p.is_file():
        raise MoglmError(f"{p}: no such {what} file")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise MoglmError(f"{p}: the {what} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def dyneval_hf(
    name_or_path: str,
    text: str,
    hp: Hyperparameters = Hyperparameters(rule="sgd"),
    *,
    context: int | None = None,
    selection: ParameterSelection = NO_EMBEDDINGS,
    stats_text: str | None = None,
    statistics: StatisticsSettings = StatisticsSettings(fraction=1.0, batch_size=1),
    search: bool = False,
    search_text: str | None = None,
    max_cost: float | None = None,
    cache: bool = False,
    cache_size: int = CACHE_SIZE,
    eval_tokens: int | None = None,
    factor: float = 1.0,
    margin: float = DEFAULT_MARGIN,
    device: str | torch.device = "cpu",
    progress: bool = True,
    log: Callable[[str], None] = print,
    out: str | Path | None = None,
) -> dict[str, Any]:
    """Static and dynamic evaluation of the Hugging Face causal LM ``name_or_path`` on ``text``; returns (and
    writes to ``out`` as JSON) the report. ``context``: tokens of conditioning before each segment (default:
    the model's positions minus the segment length, the thesis's 992 + 32 for GPT-2). ``stats_text``: held-out
    text for the RMS statistics (needed by the ``rms*`` rules); ``search`` tunes on ``search_text``;
    ``cache`` adds the neural cache (theta and lambda searched on ``search_text``)."""
    model, tokenizer = load_causal_lm(name_or_path, device)
    limit = max_positions(model) or 1024
    if context is None:
        context = max(0, limit - hp.segment_length)
    try:
        window = ContextWindowLM(model, context)
        window.check_window(hp.segment_length)
    except ValueError as e:
        raise MoglmError(str(e)) from None
    encoded = encode_text(tokenizer, text)
    ids = encoded.ids if eval_tokens is None else encoded.ids[: eval_tokens + 1]
    if eval_tokens is not None and eval_tokens + 1 < len(encoded.ids):
        spelled = tokenizer.decode(ids[1:])
        encoded = EncodedText(ids, len(spelled), len(spelled.encode("utf-8")))
    held_out = None if search_text is None else encode_text(tokenizer, search_text, "search text").ids
    if (search or cache) and held_out is None:
        raise MoglmError("--search and --cache tune on held-out text of the model's domain: give --search-text")
    rms = None
    if uses_rms(hp.rule):
        if stats_text is None:
            raise MoglmError(f"rule {hp.rule} needs RMS statistics: give --stats-text (held-out text of the model's "
                             "domain) or use --rule sgd")
        stats_ids = encode_text(tokenizer, stats_text, "statistics text").ids
        settings = StatisticsSettings(statistics.fraction, statistics.batch_size, hp.segment_length)
        rms = gradient_rms(window, stats_ids, settings, progress=progress, selection=selection)
    options = dict(factor=factor, margin=margin, selection=selection)
    report: dict[str, Any] = {"model": str(name_or_path), "context": context, "window": context + hp.segment_length,
                              "selection": selection.as_dict(), "statistics": None if rms is None else vars(statistics),
                              "search": None, "temperature": factor}
    if search:
        from .run import search_settings

        # segments no longer than the window was sized for (the context fills the rest of the positions)
        hp, report["search"] = search_settings(window, held_out, hp, rms, len(held_out) - 1, max_cost,
                                               hp.segment_length, hp.segment_length,
                                               dict(options, streams=1, boundary=None, sparse=None), log)
    tuned = None
    if cache:
        tuned = _tune_cache_on(window, held_out, hp, rms, cache_size, options)
        report["cache"] = tuned.as_dict()
    report["hyperparameters"] = hp.as_dict()
    log(f"{name_or_path}: {sum(p.numel() for p in model.parameters()):,} parameters; scoring "
        f"{len(ids) - 1:,} tokens ({encoded.characters:,} characters, {encoded.bytes:,} bytes) in segments of "
        f"{hp.segment_length}, each after up to {context} tokens of context; adapting {selection.describe()}")
    static = static_pass(window, ids, 1, hp.segment_length, factor, progress=progress, features=cache)
    result = dynamic_evaluate(window, ids, hp, rms, static=static, features=cache, progress=progress, **options)
    report |= _scores(result, encoded, tuned, ids, log)
    if out is not None:
        atomic_write_text(Path(out), json.dumps(report, indent=1))
        log(f"report: {out}")
    return report


def _tune_cache_on(window, held_out: np.ndarray, hp: Hyperparameters, rms, size: int, options: dict) -> CacheReport:
    static = static_pass(window, held_out, 1, hp.segment_length, options["factor"], features=True)
    adapted = dynamic_evaluate(window, held_out, hp, rms, static=static, features=True, **options)
    targets = stream_targets(held_out, 1, static.losses.shape[0])
    return CacheReport(tune(static.losses, static.features, targets, size),
                       tune(adapted.losses, adapted.features, targets, size))


def _scores(result: DynamicResult, encoded: EncodedText, tuned: CacheReport | None, ids: np.ndarray,
            log: Callable[[str], None]) -> dict[str, Any]:
    static, dynamic = encoded.scores(result.static_losses), encoded.scores(result.losses)
    rows = {"static": static.as_dict(), "dynamic": dynamic.as_dict()}
    if tuned is not None:
        targets = stream_targets(ids, 1, result.losses.shape[0])
        rows["static_cache"] = mixed_scores(result.static_losses, result.static_features, targets, tuned.static.best,
                                            static)[0].as_dict()
        rows["dynamic_cache"] = mixed_scores(result.losses, result.features, targets, tuned.dynamic.best,
                                             dynamic)[0].as_dict()
    log(f"static: {static.headline('subword')}")
    log(f"dynamic: {dynamic.headline('subword')} ({result.rollbacks} rollbacks); {result.cost:.2f}x the static CPU "
        f"time ({result.timing.seconds:.1f}s against {result.static_timing.seconds:.1f}s)")
    for name in ("static_cache", "dynamic_cache"):
        if name in rows:
            log(f"{name.replace('_', ' + ')}: {rows[name]['bits_per_character']:.4f} bpc")
    return {"scores": rows, "adapted": result.adapted, "rollbacks": result.rollbacks, "cost": result.cost,
            "seconds": result.timing.seconds, "static_seconds": result.static_timing.seconds,
            "cpu_seconds": result.timing.cpu_seconds, "static_cpu_seconds": result.static_timing.cpu_seconds}
