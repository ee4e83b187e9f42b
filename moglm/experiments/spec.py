"""An experiment: a shipped, versioned TOML file naming its runs, their evaluations, its tables and
figures, and the papers' numbers for them (``moglm experiment list`` shows them).

Runs are corpora x variants x seeds. A run's config is a shipped config named by a template
(``"{corpus}-mogrifier-{size}"``; ``size`` comes from the scale) with, in order, the scale's ``set``,
the corpus's, the variant's and the seed applied. Comparisons at equal parameter budget come from
``model.num_params``: every variant is sized to the same budget (the Mogrifier paper, section 3.3).

Scales: ``smoke`` (under a minute a run, on the real corpora too), ``cpu`` (hours on two cores) and ``paper`` (the
papers' sizes and schedules, for a GPU).
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..errors import MoglmError
from ..registry import for_experiment, workloads

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

FORMAT_VERSION = 1
SHIPPED = Path(__file__).resolve().parent / "definitions"
SCALES = ("smoke", "cpu", "paper")
EVALUATIONS = ("static", "mc_dropout", "mc_dropout_searched", "dynamic", "mc_dynamic", "token_losses", "cache", "dynamic_cache",
               "out_of_domain", "optimisers", "dynamic_sgd", "dynamic_rms")
#: the evaluations of a music experiment (thesis table 4.6): static, and dynamic with SGD or global RMS
ANALYSIS = "analysis"  # the kind of an experiment that adds evaluations to another's runs


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Scale(_Strict):
    size: str = Field("cpu", description="Fills {size} in config templates: the shipped config family.")
    set: dict[str, Any] = Field(default_factory=dict, description="Dotted overrides for every run.")
    corpora: dict[str, dict[str, Any]] = Field(default_factory=dict, description="Dotted overrides for one "
                                               "corpus's runs at this scale (after ``set``).")
    seeds: list[int] | None = Field(None, description="Seeds at this scale (default: the experiment's).")
    mc_samples: int = Field(200, ge=1, description="MC-dropout samples (the paper: 200).")
    mc_dynamic_samples: int = Field(10, ge=1, description="MC-dropout samples with dynamic evaluation.")
    mc_multiplier_search: bool = Field(False, description="MC dropout: search the dropout multiplier on search_tokens "
                                       "validation tokens (the paper's scaled rates, section 3.3) instead of the "
                                       "run's evaluation.mc_dropout_multiplier.")
    eval_tokens: int | None = Field(None, ge=1, description="MC dropout and dynamic evaluation score this prefix "
                                    "of each split (a music experiment's: frames, in whole songs; static evaluation "
                                    "scores the split whole unless the run's evaluation.max_tokens says otherwise).")
    search_tokens: int = Field(10_000, ge=1, description="Validation tokens that the neural cache's theta and "
                               "lambda, and an out-of-domain experiment's dynamic-evaluation settings, are searched on "
                               "(a music experiment's: frames, the first validation songs that hold them).")
    dynamic_search: bool = Field(False, description="Tune the dynamic-evaluation settings (the coordinate search "
                                 "of thesis 4.5) on search_tokens validation tokens before scoring (else the defaults).")
    dynamic_max_cost: float | None = Field(None, gt=0, description="The search's time budget: settings costing "
                                           "more than this many times a static pass are ruled out (null: none).")
    stats_batch_size: int = Field(8, ge=1, description="Dynamic evaluation's RMS statistics: streams per batch (the "
                                  "Mogrifier paper's appendix A: 1024; moglm's CPU default 8, a departure, docs/fidelity.md).")
    stats_fraction: float = Field(0.01, gt=0, le=1, description="Dynamic evaluation's RMS statistics: the fraction "
                                  "of the training split read (thesis table 5.6: 1% suffices).")
    stats_tokens: int | None = Field(None, ge=1, description="The optimisers analysis: its RMS statistics read at "
                                     "most this many training tokens whatever their row's fraction (a smoke "
                                     "scale's cap, recorded as the row's statistics_read; null: none).")
    target: str | None = Field(None, description="Out of domain: the corpus whose test text every run scores (a "
                               "data path as configs take it), read into each run's vocabulary.")
    tune_trials: int = Field(20, ge=1, description="Tuning trials per variant (experiments that tune; the "
                             "optimisers analysis: learning rates, and eps values, tried per optimiser).")
    lengths: list[int] = Field(default_factory=list, description="Reverse copy: one model per sequence length "
                               "(the paper's protocol), each tuned and trained on its own.")


class Corpus(_Strict):
    label: str = ""
    set: dict[str, Any] = Field(default_factory=dict)


class Variant(_Strict):
    label: str = ""
    config: str | None = Field(None, description="Config template for this variant (default: the experiment's).")
    set: dict[str, Any] = Field(default_factory=dict)
    x: float | None = Field(None, description="This variant's position on a sweep figure's axis.")
    series: str | None = Field(None, description="The sweep figure's line this variant belongs to (default: one line).")
    params_factor: float | None = Field(
        None, gt=0, description="Multiplies the scale's model.num_params (a size sweep); the budget is then the x.")
    tune: str | None = Field(None, description="Search space tuned for this variant (experiments that tune).")


class Table(_Strict):
    title: str
    evaluations: list[str] = Field(["static"], description="Column groups, each with valid and test.")
    splits: list[Literal["valid", "test"]] = ["valid", "test"]
    ordering: list[str] = Field(default_factory=list, description="Evaluations from best to worst as the source "
                                "reports them: each row says whether its test scores keep that order.")
    unit: Literal["native", "bits_per_byte"] = Field(
        "native", description="native: each corpus's own unit (perplexity for words, bits per character ...); "
        "bits_per_byte: bits per byte of the text, in which runs of different tokenizations compare.")


class Figure(_Strict):
    kind: Literal["learning_curves", "sweep", "length", "surprise", "unseen_words", "optimisers"]
    title: str = ""
    evaluation: str = "static"
    split: Literal["valid", "test"] = "valid"
    x_label: str = Field("rounds r", description="A sweep's x-axis label.")
    log_x: bool = Field(False, description="A sweep's x-axis on a log scale.")


class Experiment(_Strict):
    format_version: int = FORMAT_VERSION
    name: str
    description: str
    source: str = Field(description="The paper's table, figure or section it reproduces.")
    kind: str = "language_model"  # a workload's experiment kind (moglm.registry), or "analysis"
    uses: str | None = Field(None, description="analysis: the experiment whose runs it analyses.")
    config: str = Field("{corpus}-mogrifier-{size}", description="Config template (shipped name or path).")
    corpora: dict[str, Corpus] = Field(default_factory=dict)
    variants: dict[str, Variant] = Field(default_factory=dict)
    seeds: list[int] = [1]
    evaluations: list[str] = ["static"]
    scales: dict[str, Scale]
    tables: list[Table] = Field(default_factory=list)
    figures: list[Figure] = Field(default_factory=list)
    # reference[corpus][variant][evaluation] = [valid, test] (null where the paper gives none)
    reference: dict[str, dict[str, dict[str, list[float | None]]]] = Field(default_factory=dict)
    reference_note: str = ""

    @property
    def is_analysis(self) -> bool:
        """An analysis trains nothing: it adds its evaluations to the runs of the experiment it ``uses``."""
        return self.uses is not None

    @model_validator(mode="after")
    def _check(self) -> "Experiment":
        if self.format_version != FORMAT_VERSION:
            raise ValueError(f"format_version {self.format_version} is not {FORMAT_VERSION}")
        missing = [s for s in SCALES if s not in self.scales]
        if missing:
            raise ValueError(f"scales lack {', '.join(missing)}")
        unknown = [e for e in self.evaluations if e not in EVALUATIONS]
        if unknown:
            raise ValueError(f"unknown evaluation {unknown[0]!r} (choose from {', '.join(EVALUATIONS)})")
        kinds = {w.experiment_kind: w for w in workloads() if w.experiment_kind}
        if self.kind not in (*kinds, ANALYSIS):
            raise ValueError(f"unknown kind {self.kind!r} (choose from {', '.join([*kinds, ANALYSIS])})")
        if self.is_analysis != (self.kind not in kinds):
            raise ValueError("an analysis, and only an analysis, names the experiment whose runs it uses (uses = ...)")
        allowed = kinds[self.kind].evaluations if self.kind in kinds else None
        if allowed is not None and any(e not in allowed for e in self.evaluations):
            raise ValueError(f"a {self.kind} experiment's evaluations are {', '.join(allowed)}")
        if not self.is_analysis and not self.variants:
            raise ValueError("an experiment needs at least one variant")
        return self


@dataclass(frozen=True)
class RunSpec:
    """One run of an experiment: its name (the run directory's), what it is, and its config."""

    name: str
    corpus: str
    variant: str
    seed: int
    config: str  # shipped config name or path (template filled in)
    overrides: dict[str, Any]  # dotted keys, applied in order
    x: float | None = None
    tune: str | None = None
    series: str | None = None


def shipped() -> dict[str, Path]:
    return {p.stem: p for p in sorted(SHIPPED.glob("*.toml"))}


def load_experiment(name_or_path: str | Path) -> Experiment:
    """A shipped experiment by name, or a TOML file; a bad file is a one-line error naming it."""
    path = Path(name_or_path)
    if not path.is_file():
        found = shipped().get(str(name_or_path))
        if found is None:
            raise MoglmError(f"no experiment {name_or_path!r}: choose from {', '.join(shipped())}, or give a TOML file")
        path = found
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        return Experiment.model_validate(data)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise MoglmError(f"{path}: {e}") from None
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise MoglmError(f"{path}: {where}: {err['msg']}") from None


def scale_of(exp: Experiment, scale: str) -> Scale:
    if scale not in exp.scales:
        raise MoglmError(f"experiment {exp.name} has no scale {scale!r}: choose from {', '.join(exp.scales)}")
    return exp.scales[scale]


def runs(exp: Experiment, scale: str, data: str | None = None, data_format: str = "char") -> list[RunSpec]:
    """Every run of ``exp`` at ``scale``. ``data``: one corpus of the user's (``data_format``) replaces the
    experiment's corpora, named after the file or directory."""
    sc = scale_of(exp, scale)
    workload = for_experiment(exp.kind)
    corpora = dict(exp.corpora)
    if data is not None:
        first = next(iter(corpora), None)
        base_corpus = first if first is not None else "custom"
        name = Path(data).stem or "custom"
        data_set = {"data.path": str(data)} | ({"data.format": data_format} if workload.data_format else {})
        corpora = {name: Corpus(label=name, set=data_set)}
        template_corpus = base_corpus
    else:
        template_corpus = None
    if workload.has("experiment_runs"):
        return workload.hook("experiment_runs")(exp, sc, data)
    out = []
    for corpus_name, corpus in corpora.items():
        for variant_name, variant in exp.variants.items():
            for seed in sc.seeds or exp.seeds:
                template = variant.config or exp.config
                config = template.format(corpus=template_corpus or corpus_name, size=sc.size)
                overrides = (copy.deepcopy(sc.set) | copy.deepcopy(sc.corpora.get(template_corpus or corpus_name, {}))
                             | copy.deepcopy(corpus.set) | copy.deepcopy(variant.set))
                overrides[workload.seed_key] = seed
                x = variant.x
                if variant.params_factor is not None:
                    if "model.num_params" not in overrides:
                        raise MoglmError(f"{exp.name}: variant {variant_name} scales model.num_params, which the "
                                         f"scale does not set")
                    x = overrides["model.num_params"] = int(round(overrides["model.num_params"] * variant.params_factor))
                out.append(RunSpec(f"{corpus_name}-{variant_name}-s{seed}", corpus_name, variant_name, seed, config,
                                   overrides, x, variant.tune, variant.series))
    return out


def label(exp: Experiment, run: RunSpec) -> str:
    return exp.variants[run.variant].label or run.variant
