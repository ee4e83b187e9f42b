"""lm-evaluation-harness's ``moglm`` model type: a run directory scored by lm-eval's tasks.

::

    moglm lm-eval --model moglm --model_args run=runs/x --tasks wikitext
    moglm lm-eval --model moglm --model_args run=runs/x,dynamic=true --tasks wikitext

Importing this module registers the type with lm-eval (``@register_model``); ``moglm lm-eval`` imports it and
runs lm-eval's own command line, and pyproject declares it under the ``lm_eval.models`` entry-point group,
which releases of lm-eval that discover plug-ins read (0.4.13 does not). ``model_args`` keys:
:data:`moglm.harness.settings.KEYS`. The scoring itself is :class:`moglm.harness.scorer.RunScorer`; with
``dynamic=true``, ``loglikelihood_rolling`` is dynamic evaluation (Krause et al. 2018), each document
from the trained weights.
"""

from __future__ import annotations

import logging
from typing import Any

import lm_eval.models  # noqa: F401 - lm-eval's own types first: it fills an empty registry only
import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from ..errors import MoglmError
from .loading import load_scorer
from .settings import KEYS, HarnessSettings

log = logging.getLogger("lm_eval.moglm")  # under lm-eval's logger: its handler, its LMEVAL_LOG_LEVEL
#: the generation settings ``generate_until`` reads from a task's ``generation_kwargs``
GENERATION_KEYS = ("until", "max_gen_toks", "do_sample", "temperature", "top_k", "top_p")
MAX_GEN_TOKS = 256  # lm-eval's default


@register_model("moglm")
class MoglmLM(LM):
    """A moglm run as an lm-eval model: ``MoglmLM(run="runs/x", dynamic=True)`` from Python, or
    ``--model moglm --model_args run=runs/x,...`` from lm-eval's command line."""

    def __init__(self, **model_args: Any) -> None:
        super().__init__()
        self._setup(model_args, None)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> "MoglmLM":
        from lm_eval.utils import simple_parse_args_string

        return cls._create(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> "MoglmLM":
        return cls._create(dict(arg_dict), additional_config)

    @classmethod
    def _create(cls, model_args: dict, additional: dict | None) -> "MoglmLM":
        """lm-eval's ``batch_size`` and ``max_batch_size`` go with the model_args (what these give wins); its
        ``--device`` is the device unless model_args name one."""
        lm = cls.__new__(cls)
        LM.__init__(lm)
        additional = {k: v for k, v in (additional or {}).items() if v is not None and k in KEYS}
        lm._setup({**{k: v for k, v in additional.items() if k != "device"}, **model_args}, additional.get("device"))
        return lm

    def _setup(self, model_args: dict, harness_device: str | None) -> None:
        self.settings = HarnessSettings.from_args(model_args)
        self.scorer, self.resolved = load_scorer(self.settings, harness_device, log.info)
        self._device = self.scorer.device
        self.generator = torch.Generator().manual_seed(self.settings.seed)

    def get_model_info(self) -> dict[str, Any]:
        """What lm-eval records under ``config`` in its results: the run and what was resolved."""
        from .. import __version__

        return {"moglm": __version__, "run": str(self.settings.run), **self.resolved}

    # -- the three requests ----------------------------------------------------------------------------
    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = [tuple(r.args) for r in requests]
        results = self.scorer.loglikelihood(pairs)
        for pair, result in zip(pairs, results):
            self.cache_hook.add_partial("loglikelihood", pair, result)
        self._report_unknown()
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        dynamic = self.settings.dynamic
        totals = {"tokens": 0, "static": 0.0, "dynamic": 0.0, "rollbacks": 0}
        out = []
        for request in _each(requests, "moglm " + ("dynamic" if dynamic else "rolling"),
                             not disable_tqdm and self.rank == 0):
            (text,) = request.args
            if dynamic:
                result = self.scorer.rolling_dynamic(text)
                score = 0.0 if result is None else -result.scores.nll
                if result is not None:
                    totals["tokens"] += result.scores.tokens
                    totals["static"] += result.static.nll
                    totals["dynamic"] += result.scores.nll
                    totals["rollbacks"] += result.rollbacks
            else:
                score = self.scorer.rolling(text)
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), score)
            out.append(score)
        if dynamic and totals["tokens"]:
            n = totals["tokens"]
            log.info(f"dynamic evaluation of {len(requests)} documents, {n:,} tokens: static "
                     f"{totals['static'] / n:.4f} -> dynamic {totals['dynamic'] / n:.4f} nats per token; "
                     f"{totals['rollbacks']} rollbacks")
        self._report_unknown()
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out = []
        for request in _each(requests, "moglm generate", not disable_tqdm and self.rank == 0):
            context, gen_kwargs = request.args
            until, max_tokens, temperature, top_k = generation_options(gen_kwargs or {})
            text = self.scorer.generate(context, until, max_tokens, temperature, top_k, self.generator)
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
            out.append(text)
        return out

    def _report_unknown(self) -> None:
        """A note on the tokens the run's vocabulary lacks, read as ``<unk>`` (reset after each note)."""
        if self.scorer.unknown:
            examples = ", ".join(repr(t) for t, _ in self.scorer.unknown.most_common(5))
            log.warning(f"{len(self.scorer.unknown):,} distinct tokens of these requests are not in the run's "
                        f"vocabulary and were read as {self.scorer.vocab.unk} (most frequent: {examples}): the scores "
                        "are of the text with those tokens replaced")
            self.scorer.unknown.clear()


def generation_options(gen_kwargs: dict[str, Any]) -> tuple[list[str], int, float, int | None]:
    """``(until, max_tokens, temperature, top_k)`` from a task's ``generation_kwargs``: greedy (temperature 0)
    unless ``do_sample``; a setting moglm cannot honour is a one-line error."""
    if unknown := [k for k in gen_kwargs if k not in GENERATION_KEYS]:
        raise MoglmError(f"--model moglm: generation setting {unknown[0]!r} is not supported (supported: "
                         f"{', '.join(GENERATION_KEYS)})")
    until = gen_kwargs.get("until") or []
    until = [until] if isinstance(until, str) else list(until)
    max_tokens = int(gen_kwargs.get("max_gen_toks", MAX_GEN_TOKS))
    if float(gen_kwargs.get("top_p", 1.0)) < 1.0:
        raise MoglmError("--model moglm: top_p sampling is not supported (use top_k)")
    temperature = float(gen_kwargs.get("temperature", 1.0)) if gen_kwargs.get("do_sample", False) else 0.0
    if temperature < 0:
        raise MoglmError(f"--model moglm: temperature must be >= 0, got {temperature}")
    top_k = gen_kwargs.get("top_k")
    return until, max_tokens, temperature, None if top_k in (None, 0, -1) else int(top_k)


def _each(requests, desc: str, enabled: bool):
    """``requests`` one by one, counted on moglm's one progress chooser (a bar on a terminal, plain lines in a
    log)."""
    from ..progress import progress_bar

    bar = progress_bar(len(requests), desc, 1, enabled)
    try:
        for request in requests:
            yield request
            bar.update(1)
    finally:
        bar.close()
