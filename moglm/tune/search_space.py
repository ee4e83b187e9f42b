"""Search-space files: what a study tunes, from which base config, with which budgets and sampler.

A search space is a TOML or YAML file, validated like a run config (unknown keys and bad values are
one-line errors naming the field)::

    description = "Mogrifier LSTM, the paper's table 4"
    base = "ptb-word-mogrifier-cpu"       # run config every trial starts from (shipped name or path)
    target = "train"                      # or "dyneval": tune dynamic evaluation of a trained run;
                                          # or "reverse-copy": train the task (moglm.tune.reverse_copy)

    [study]                               # sampler = "gp" (Gaussian process), "tpe" or "random"
    sampler = "gp"
    seed = 0
    [pruner]                              # median, percentile, hyperband or none
    type = "median"
    [budget]                              # trials in total, wall time, training tokens per trial
    trials = 100
    [fixed]                               # set in every trial and in the best config
    [trial]                               # set in every trial only (cheaper evaluation, ...)
    [params]                              # dotted config keys and their ranges
    "train.learning_rate" = { low = 0.001, high = 0.004, log = true }
    "model.cell.rounds" = { low = 0, high = 6, int = true }
    "model.tie_embeddings" = { choices = [true, false] }

Shipped spaces (``moglm/tune/spaces``) reproduce the Mogrifier paper's appendix A, tables 4-6.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..errors import MoglmError
from ..registry import for_tuning, workloads
from ..runs.config import read_mapping

SPACES = Path(__file__).resolve().parent / "spaces"
Scalar = Union[bool, int, float, str]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ParamSpec(_Section):
    """One tuned parameter: a range (``low``/``high``, optionally ``log``, ``int``, ``step``) or ``choices``."""

    low: float | None = None
    high: float | None = None
    log: bool = False
    integer: bool = Field(False, alias="int")
    step: float | None = Field(None, gt=0)
    choices: list[Scalar] | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _check(self) -> "ParamSpec":
        if self.choices is not None:
            if self.low is not None or self.high is not None or self.log or self.integer or self.step:
                raise ValueError("give either choices or low/high (with log, int, step), not both")
            return self
        if self.low is None or self.high is None:
            raise ValueError("give low and high (or choices)")
        if not self.low < self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        if self.log and self.low <= 0:
            raise ValueError(f"log spacing needs low > 0, got {self.low}")
        if self.log and self.step:
            raise ValueError("step and log cannot be combined")
        if self.integer and not (float(self.low).is_integer() and float(self.high).is_integer()):
            raise ValueError("int ranges need integer low and high")
        return self

    def suggest(self, trial, name: str) -> Any:
        """The value of ``name`` for an Optuna trial."""
        if self.choices is not None:
            return trial.suggest_categorical(name, self.choices)
        if self.integer:
            return trial.suggest_int(name, int(self.low), int(self.high), step=int(self.step or 1), log=self.log)
        return trial.suggest_float(name, self.low, self.high, step=self.step, log=self.log)

    def distribution(self):
        """The Optuna distribution ``suggest`` draws from."""
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.choices is not None:
            return CategoricalDistribution(self.choices)
        if self.integer:
            return IntDistribution(int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return FloatDistribution(self.low, self.high, log=self.log, step=self.step)

    def position(self, value: Any) -> float:
        """Where ``value`` lies in the range, 0 to 1 (in log space for log ranges; index for choices)."""
        if self.choices is not None:
            return self.choices.index(value) / max(len(self.choices) - 1, 1) if value in self.choices else math.nan
        if self.log:
            return (math.log(value) - math.log(self.low)) / (math.log(self.high) - math.log(self.low))
        return (value - self.low) / (self.high - self.low)


class StudySettings(_Section):
    sampler: Literal["gp", "tpe", "random"] = Field("gp", description="gp: Gaussian process (closest to the "
                                                    "paper's Vizier); tpe: tree-structured Parzen; random.")
    seed: int | None = Field(0, description="Seed of the sampler (null: a random seed).")
    startup_trials: int = Field(10, ge=0, description="Random trials before the model-based sampler takes over.")


class PrunerSettings(_Section):
    type: Literal["median", "percentile", "hyperband", "none"] = "median"
    startup_trials: int = Field(5, ge=0, description="Trials that finish before any pruning.")
    warmup: float = Field(0.3, ge=0.0, le=1.0, description="Fraction of a trial's steps before it can be pruned.")
    percentile: float = Field(50.0, gt=0.0, lt=100.0, description="percentile pruner: prune above this percentile.")


class Budget(_Section):
    trials: int = Field(100, ge=0, description="Trials in the study in total (all workers, all invocations).")
    timeout: float | None = Field(None, gt=0, description="Seconds of one invocation (no new trial after them).")
    max_tokens: int | None = Field(None, ge=1, description="Training tokens per trial (sets train.max_tokens).")


class SearchSpace(_Section):
    description: str | None = None
    target: str = Field("train", description="What a trial tunes: a workload's tuning target (moglm.registry): "
                        "train, dyneval or reverse-copy.")
    base: str | None = Field(None, description="Run config of every trial (shipped name or path); train target.")
    study: StudySettings = Field(default_factory=StudySettings)
    pruner: PrunerSettings = Field(default_factory=PrunerSettings)
    budget: Budget = Field(default_factory=Budget)
    fixed: dict[str, Any] = Field(default_factory=dict)
    trial: dict[str, Any] = Field(default_factory=dict)
    params: dict[str, ParamSpec] = Field(min_length=1)

    @field_validator("target")
    @classmethod
    def _known_target(cls, value: str) -> str:
        targets = [w.tuning_target for w in workloads() if w.tuning_target]
        if value not in targets:
            raise ValueError(f"unknown target {value!r} (choose from {', '.join(targets)})")
        return value

    @model_validator(mode="after")
    def _check_keys(self) -> "SearchSpace":
        for section in ("fixed", "trial", "params"):
            for key in getattr(self, section):
                problem = for_tuning(self.target).hook("tuning_key_problem")(key)
                if problem:
                    raise ValueError(f"{section}.{key}: {problem}")
        return self

    @field_validator("params", mode="before")
    @classmethod
    def _flatten(cls, value: Any) -> Any:
        return _flatten_params(value) if isinstance(value, dict) else value


def _flatten_params(value: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"train": {"learning_rate": {...}}}`` (TOML tables) -> ``{"train.learning_rate": {...}}``."""
    out: dict[str, Any] = {}
    spec_keys = set(ParamSpec.model_fields) | {"int"}
    for key, item in value.items():
        if isinstance(item, dict) and item and all(isinstance(v, dict) for v in item.values()) \
                and not set(item) & spec_keys:
            out.update(_flatten_params(item, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = item
    return out


# -- finding and reading ------------------------------------------------------------------------------
def shipped_spaces() -> dict[str, Path]:
    """Search spaces that ship with moglm, by name."""
    return {p.stem: p for p in sorted(SPACES.glob("*.toml"))}


def locate_space(space: str | Path) -> Path:
    p = Path(space)
    if p.is_file():
        return p
    shipped = shipped_spaces()
    if str(space) in shipped:
        return shipped[str(space)]
    raise MoglmError(f"{space}: no such search-space file or shipped space (shipped: {', '.join(shipped)})")


def validate_space(data: dict[str, Any], source: str = "search space") -> SearchSpace:
    """Validate a mapping; the first problem is a one-line :class:`MoglmError` naming the field."""
    try:
        return SearchSpace.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"] if not re.fullmatch(r"function-\w+\[.*\]", str(x)))
        if err["type"] == "extra_forbidden":
            raise MoglmError(f"{source}: unknown key {where!r}") from None
        msg = err["msg"].removeprefix("Value error, ")
        raise MoglmError(f"{source}: {where}: {msg}" if where else f"{source}: {msg}") from None


def load_space(space: str | Path) -> tuple[SearchSpace, Path]:
    """The validated search space of a file path or shipped name, and its path."""
    path = locate_space(space)
    return validate_space(read_mapping(path), str(path)), path


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """``data["a"]["b"]["c"] = value`` for ``key = "a.b.c"``, creating sections on the way."""
    *sections, last = key.split(".")
    node = data
    for part in sections:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise MoglmError(f"{key}: {part} is not a section")
    node[last] = value
