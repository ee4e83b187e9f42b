"""The ``model_args`` of lm-evaluation-harness's ``moglm`` model type, checked: every key is known, every value
of its type, and dynamic-evaluation settings come with ``dynamic=true``. The defaults are policy and live here.

::

    lm_eval --model moglm --model_args run=runs/x,dynamic=true,learning_rate=3e-4,segment_length=20 ...
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import MoglmError

#: every ``model_args`` key the ``moglm`` model type knows, and what it sets
KEYS = {
    "run": "the run directory made by `moglm train` (required)",
    "checkpoint": "best or last (default: best)",
    "device": "cpu, cuda, cuda:1 ... (default: lm-eval's --device, on CPU where CUDA is absent)",
    "logit_factor": "multiply the logits by this factor (default: the run's results.json, as `moglm evaluate`)",
    "dynamic": "true: loglikelihood_rolling adapts the weights while it scores each document (default: false)",
    "rule": "dynamic evaluation's update rule (default: the run's dyneval/full.json, else rms-rmsdecay)",
    "learning_rate": "dynamic evaluation's learning rate",
    "decay": "dynamic evaluation's decay towards the trained weights",
    "eps": "dynamic evaluation's RMS stabiliser",
    "segment_length": "dynamic evaluation's tokens per update",
    "momentum": "sgd-momentum's mu",
    "alpha": "rmsprop's running average weight",
    "margin": "the divergence guard's margin, nats per token over static (default: 3)",
    "stats_fraction": "the rms rules' statistics: fraction of the training split (default: 0.01)",
    "stats_batch_size": "the rms rules' statistics: streams per batch (default: 8)",
    "seed": "the seed of generate_until's sampling (do_sample=true; default: 1234)",
    "batch_size": "lm-eval's; accepted and unused (a context's continuations are read side by side)",
    "max_batch_size": "lm-eval's; accepted and unused",
    "trust_remote_code": "lm-eval's; accepted and unused (a run loads safetensors and JSON, never code)",
}
#: the keys that set dynamic evaluation, by the name of the :class:`~moglm.dynamic_evaluation.Hyperparameters`
#: or :class:`~moglm.dynamic_evaluation.StatisticsSettings` field they set
HYPERPARAMETERS = {"rule": "rule", "learning_rate": "lr", "decay": "decay", "eps": "eps",
                   "segment_length": "segment_length", "momentum": "momentum", "alpha": "alpha"}
STATISTICS = {"stats_fraction": "fraction", "stats_batch_size": "batch_size"}
DYNAMIC_ONLY = (*HYPERPARAMETERS, *STATISTICS, "margin")
FLOATS = ("logit_factor", "learning_rate", "decay", "eps", "momentum", "alpha", "margin", "stats_fraction")
INTEGERS = ("segment_length", "stats_batch_size", "seed")
DEFAULT_SEED = 1234


@dataclass(frozen=True)
class HarnessSettings:
    """What ``--model moglm`` reads: the run, its checkpoint and device, the logit factor (``None``: the run's),
    and with ``dynamic`` the dynamic-evaluation settings given (the rest come from the run's
    ``dyneval/full.json`` when a ``moglm dyneval`` wrote one, else the defaults)."""

    run: Path
    checkpoint: str = "best"
    device: str | None = None  # None: lm-eval's --device (lenient) or the run's train.device
    logit_factor: float | None = None
    dynamic: bool = False
    hyperparameters: dict[str, Any] = field(default_factory=dict)  # Hyperparameters fields given
    statistics: dict[str, Any] = field(default_factory=dict)  # StatisticsSettings fields given
    margin: float | None = None
    seed: int = DEFAULT_SEED

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> "HarnessSettings":
        """Settings from ``model_args`` (strings, as lm-eval's ``key=value`` parser types them, or values);
        a one-line :class:`~moglm.errors.MoglmError` for an unknown key or a wrong value."""
        if unknown := [k for k in args if k not in KEYS]:
            raise MoglmError(f"--model moglm: unknown model_args key {unknown[0]!r} (known: {', '.join(KEYS)})")
        if args.get("run") in (None, ""):
            raise MoglmError("--model moglm needs model_args run=RUN_DIR (a run directory made by `moglm train`)")
        values = {k: _typed(k, v) for k, v in args.items() if v is not None}
        dynamic = values.get("dynamic", False)
        if not dynamic and (given := [k for k in DYNAMIC_ONLY if k in values]):
            raise MoglmError(f"--model moglm: {given[0]} sets dynamic evaluation, which is off (add dynamic=true)")
        if values.get("checkpoint", "best") not in ("best", "last"):
            raise MoglmError(f"--model moglm: checkpoint must be best or last, got {values['checkpoint']!r}")
        return cls(run=Path(str(values["run"])).expanduser(), checkpoint=values.get("checkpoint", "best"),
                   device=values.get("device"), logit_factor=values.get("logit_factor"), dynamic=dynamic,
                   hyperparameters={HYPERPARAMETERS[k]: values[k] for k in HYPERPARAMETERS if k in values},
                   statistics={STATISTICS[k]: values[k] for k in STATISTICS if k in values},
                   margin=values.get("margin"), seed=values.get("seed", DEFAULT_SEED))


def _typed(key: str, value: Any) -> Any:
    """``value`` of ``key`` as its type (a string from a command line is converted), else a one-line error."""
    def wrong(kind: str) -> MoglmError:
        return MoglmError(f"--model moglm: {key} must be {kind}, got {value!r}")

    if key in ("dynamic", "trust_remote_code"):
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("true", "1", "yes", "false", "0", "no"):
            return str(value).lower() in ("true", "1", "yes")
        raise wrong("true or false")
    if key in FLOATS:
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise wrong("a number") from None
        if isinstance(value, bool) or not math.isfinite(number):
            raise wrong("a finite number")
        if key in ("logit_factor", "margin") and number <= 0:
            raise wrong("> 0")
        return number
    if key in INTEGERS:
        if isinstance(value, bool) or not str(value).lstrip("-").isdigit():
            raise wrong("an integer")
        return int(value)
    return value
