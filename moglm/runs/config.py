"""The run configuration: typed, documented, versioned.

A config is a TOML or YAML file with the sections below; every field has a type, a default and a
description (``moglm train --help-config`` prints them). Command-line overrides use dotted keys
(``train.learning_rate=0.002``). The resolved config is written to the run directory with
``format_version``, so a run can always be reproduced and resumed.
"""

from __future__ import annotations

import dataclasses
import typing
import sys
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, ValidationInfo, field_validator,
                      model_validator)

from ..data.tokenizer import DEFAULT_KIND, DEFAULT_VOCAB_SIZE
from ..errors import MoglmError
from .directory import to_toml
from ..model.architectures import MODEL_ARCHITECTURES as ARCHITECTURES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

FORMAT_VERSION = 1
SHIPPED = Path(__file__).resolve().parent.parent / "configs"


class Section(BaseModel):
    # infinities and NaN are refused everywhere: none is a meaningful setting, and TOML would not keep them
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class TokenizerTraining(Section):
    kind: Literal["bpe", "unigram"] = Field(
        DEFAULT_KIND, description="bpe: byte-pair encoding (Sennrich et al. 2016); unigram: a unigram language model (Kudo "
        "2018); both over GPT-2's byte-level pre-tokenization, so every text encodes and decodes to itself.")
    vocab_size: int = Field(DEFAULT_VOCAB_SIZE, ge=257, description="Tokens in the vocabulary at most (the 256 byte symbols "
                            "included).")


class DataConfig(Section):
    path: str | None = Field(
        None,
        description="Corpus: a directory with train/valid/test files, one file (split 90/5/5), or null for the "
        "Python documentation shipped with the interpreter. Relative paths are also looked up in $MOGLM_DATA "
        "and in shared/data beside the checkout.",
    )
    source: str | None = Field(
        None,
        description="A Hugging Face datasets corpus instead of path: a folder written by save_to_disk, local data "
        "files (.txt, .json/.jsonl, .parquet or .csv: one file, a folder of them, or a glob), or a Hub dataset "
        "name ('wikitext:wikitext-2-raw-v1' names a configuration) where the machine has network. Streamed record "
        "by record, never loaded whole.",
    )
    text_field: str = Field("text", description="data.source: the field of each record that holds its text.")
    split_names: dict[str, str] | None = Field(
        None, description="data.source: the dataset's name for each of train, valid and test, e.g. {valid = "
        "\"validation\"} (default: train; validation, valid or dev; test). A dataset with one split is cut by "
        "split_fractions of its records.")
    format: Literal["word", "ptb_char", "char", "byte", "tokenizer"] = Field(
        "char",
        description="word: whitespace tokens + <eos> per line; ptb_char: Mikolov's space-separated characters; "
        "char: one token per character; byte: one token per byte; tokenizer: subword tokens of data.tokenizer "
        "(or of one trained by data.tokenizer_training).",
    )
    tokenizer: str | None = Field(
        None, description="format = 'tokenizer': a tokenizers JSON file, a folder holding tokenizer.json, or a "
        "pretrained tokenizer's name (the local Hugging Face cache, or the Hub where there is network). Text it "
        "does not cover is an error.")
    tokenizer_training: TokenizerTraining | None = Field(
        None, description="format = 'tokenizer' without data.tokenizer: train a byte-level tokenizer on the training "
        "split first, {kind = \"bpe\" or \"unigram\", vocab_size = tokens at most, 257 or more} (defaults: bpe, "
        "8000); the run directory keeps it (tokenizer.json).")
    detokenize: Literal["wikitext", "wikitext-wrapped"] | None = Field(
        None, description="Undo the corpus's tokenization before a char, byte or tokenizer model reads it "
        "(wikitext: lm-evaluation-harness's WikiText detokenizer, article by article; wikitext-wrapped: that, then "
        "every other article hard-wrapped at 64-80 columns, as plain-text files are). Bits per byte still divide "
        "by the bytes of the original text, so models of either form share the denominator.")
    files: dict[str, str] | None = Field(None, description="Explicit split files {train, valid, test}, relative to path.")
    split_fractions: tuple[float, float, float] = Field(
        (0.9, 0.05, 0.05), description="Train/valid/test fractions when path is a single file (or data.source has "
        "one split)."
    )
    episodic: bool = Field(
        False, description="One sequence per line, padded and masked, zero state per batch (instead of one stream)."
    )
    max_length: int | None = Field(None, ge=1, description="Episodic mode: truncate sequences to this many tokens.")

    @field_validator("split_fractions")
    @classmethod
    def _check_fractions(cls, fractions: tuple[float, float, float]) -> tuple[float, float, float]:
        if any(f <= 0 for f in fractions) or sum(fractions) > 1 + 1e-9:
            raise ValueError(f"each fraction must be > 0 and together at most 1, got {list(fractions)}")
        return fractions

    @model_validator(mode="after")
    def _check_text(self) -> "DataConfig":
        if self.source is not None and (self.path is not None or self.files is not None):
            raise ValueError("set data.source (a datasets corpus) or data.path / data.files (files), not both")
        subword = self.tokenizer is not None or self.tokenizer_training is not None
        if self.format == "tokenizer" and (self.tokenizer is None) == (self.tokenizer_training is None):
            raise ValueError("format 'tokenizer' needs one of data.tokenizer (a tokenizer to read) and "
                             "data.tokenizer_training (one to train on the training split)")
        if subword and self.format != "tokenizer":
            raise ValueError(f"data.tokenizer and data.tokenizer_training need format 'tokenizer', not {self.format!r}")
        if self.detokenize is not None and self.format in ("word", "ptb_char"):
            raise ValueError(f"data.detokenize applies to the char, byte and tokenizer formats: a {self.format} model "
                             "reads the corpus's own tokens")
        return self


class WithCellOptions(Section):
    """A section with ``architecture`` and then ``cell``: the cell options are checked against that architecture's
    typed options (:func:`validate_cell_options`); an invalid architecture is reported by its own check."""

    @field_validator("cell", check_fields=False)
    @classmethod
    def _check_cell(cls, cell: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        architecture = info.data.get("architecture")
        return validate_cell_options(architecture, cell) if architecture in ARCHITECTURES else cell


class ModelConfig(WithCellOptions):
    architecture: str = Field("mogrifier", description="Sequence model, a recurrent cell or the segment-memory "
                              f"transformer: one of {sorted(ARCHITECTURES)}.")
    num_layers: int = Field(2, ge=1, description="Recurrent layers.")
    hidden_size: int | None = Field(
        None, ge=1, description="Hidden units per layer; null to choose the largest that fits num_params."
    )
    num_params: int | None = Field(
        None, ge=1, description="Parameter budget: the hidden size is the largest whose model fits (paper protocol)."
    )
    input_embedding_ratio: float = Field(
        1.0, ge=0.0, description="Embedding size = round(min(ratio, 1) * hidden); below 1 adds a down-projection."
    )
    tie_embeddings: bool = Field(True, description="Share the input embedding with the output softmax.")
    skip_sum: bool = Field(True, description="Output is the sum of all layers' outputs (else the last layer's).")
    mos_components: int = Field(1, ge=1, description="Mixture-of-softmaxes components (1: a plain softmax).")
    cell: dict[str, Any] = Field(
        default_factory=dict,
        description="The architecture's own options, e.g. {rounds = 5, rank = 40} for mogrifier; each "
        "architecture's are listed below ([model.cell] for <architecture>).",
    )
    init: Literal["torch", "paper"] = Field(
        "torch", description="Initialisation: torch (torch.nn.LSTM's uniform, as the modules default to) or paper "
        "(the original experiments' truncated normals; the shipped configs select it).")
    orthogonal_init: float | None = Field(
        None, gt=0.0, description="The mLSTM recipe (thesis 3.5.1): initialise each gate's block of the hidden "
        "weights (weight_hh, the mLSTM's weight_mh) as a random orthogonal matrix times this scale (null: off).")
    forget_bias: float | None = Field(
        None, description="The mLSTM recipe: the forget gate's initial bias, LSTM-gated architectures (null: the init's).")
    weight_norm: bool = Field(False, description="The mLSTM recipe: weight normalisation of the hidden weights.")
    input_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the embeddings into layer 1.")
    variational_input_dropout: bool = Field(
        False, description="Input dropout with one mask per sequence (each stream's window), shared by its steps, "
        "as the thesis's mLSTM recipe (3.5.2, after Gal and Ghahramani 2016); false: a fresh mask at every step.")
    inter_layer_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the inputs of layers >= 2.")
    state_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Variational dropout on h_prev, one mask per sequence.")
    output_dropout: float = Field(
        0.0, ge=0.0, lt=1.0, description="Dropout on the stack output (and on the down-projection / MoS components)."
    )
    backend: Literal["auto", "compiled", "fused", "reference"] = Field(
        "auto",
        description="Time-loop implementation: auto (compiled C++ on CPU float32/float64 where it builds, else fused "
        "where supported, else reference), compiled, fused or reference.",
    )

    @model_validator(mode="after")
    def _check(self) -> "ModelConfig":
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"architecture must be one of {sorted(ARCHITECTURES)}, got {self.architecture!r}")
        if (self.hidden_size is None) == (self.num_params is None):
            raise ValueError("set exactly one of hidden_size and num_params")
        return self


class TrainConfig(Section):
    batch_size: int = Field(64, ge=1, description="Streams (stripes) per batch.")
    bptt: int = Field(70, ge=1, description="Truncated-BPTT window length in tokens.")
    max_steps: int = Field(1000, ge=1, description="Optimizer steps in total.")
    max_tokens: int | None = Field(
        None, ge=1, description="If set, training tokens in total (overrides max_steps: steps = tokens / (batch*bptt))."
    )
    learning_rate: float = Field(0.003, gt=0.0, description="Adam learning rate (the initial one under a schedule; "
                                 "normalised_rmsprop: the update's length).")
    optimizer: Literal["adam", "normalised_rmsprop"] = Field(
        "adam", description="adam (the Mogrifier paper's, and the thesis's later mLSTM recipe), or normalised_rmsprop: "
        "RMSprop whose update is rescaled to the learning rate's length (thesis 3.5.1, eq. 3.14; its running average "
        "weight is adam_beta2 and its stabiliser adam_eps).")
    learning_rate_schedule: Literal["constant", "linear"] = Field(
        "constant", description="constant (the Mogrifier paper's), or linear: decays from learning_rate at the first "
        "step to min_learning_rate at the last (the thesis's mLSTM recipe, 3.5.1).")
    min_learning_rate: float = Field(0.0, ge=0.0, description="The linear schedule's learning rate at the last step.")
    adam_beta1: float = Field(0.0, ge=0.0, lt=1.0, description="Adam beta1 (0 in the Mogrifier paper; the thesis's "
                              "mLSTM used Adam's default 0.9).")
    adam_beta2: float = Field(0.999, gt=0.0, lt=1.0, description="Adam beta2.")
    adam_eps: float = Field(1e-8, gt=0.0, description="Adam epsilon.")
    l2_penalty: float = Field(0.0, ge=0.0, description="l2_penalty * 0.5 * sum(w^2) added to the window's summed loss.")
    clip_norm: float = Field(10.0, gt=0.0, description="Global gradient-norm clip of the summed loss's gradient.")
    state_reset_probability: float = Field(
        0.01, ge=0.0, le=1.0, description="Per-row probability of zeroing the carried state before a window."
    )
    eval_every: int = Field(200, ge=1, description="Evaluate on validation (and checkpoint) every this many steps.")
    eval_tokens: int | None = Field(
        None, ge=1, description="Validation tokens used during training (null: the whole split)."
    )
    eval_batch_size: int = Field(16, ge=1, description="Streams for validation during training.")
    averaging_patience: int | None = Field(
        3, ge=1, description="Start weight averaging after this many evaluations without improvement (null: never)."
    )
    averaging_start: float | None = Field(
        0.8, ge=0.0, le=1.0, description="Start weight averaging at this fraction of training at the latest (null: off)."
    )
    early_stopping_patience: int | None = Field(
        None, ge=1, description="Stop after this many evaluations without improvement (null: never)."
    )
    seed: int = Field(1, ge=0, le=2**63 - 1, description="Random seed (weights, dropout masks, state resets, "
                      "episode order), 0 to 2^63 - 1.")
    device: str = Field("auto", description="auto (CUDA when available), cpu, cuda or cuda:N.")
    cuda_graphs: bool | None = Field(
        None, description="Replay each recurrent layer's fused window as a CUDA graph, captured once per window "
        "shape (one launch per window instead of one per kernel; docs/fused-recurrence.md), in training, its "
        "validations and the final evaluation. null (auto): on where one CUDA device trains, off on CPU and for "
        "data-parallel training, and off with one line where a capture fails or window shapes keep changing; true: "
        "on, an error where impossible (a failed capture still falls back, with a line); false: off.")
    threads: int | None = Field(None, ge=1, description="CPU threads for torch (null: torch's default).")

    @model_validator(mode="after")
    def _check_schedule(self) -> "TrainConfig":
        if self.learning_rate_schedule == "linear" and self.min_learning_rate > self.learning_rate:
            raise ValueError(f"min_learning_rate {self.min_learning_rate} is above learning_rate {self.learning_rate}")
        return self


class EvaluationConfig(Section):
    temperature_search: bool = Field(True, description="Search the softmax temperature factor on validation.")
    temperature_tokens: int | None = Field(
        None, ge=1, description="Validation tokens used by the temperature search (null: 50,000, or the tokens the "
        "run trained on when fewer, so a short run gets a short search).")
    batch_size: int = Field(1, ge=1, description="Streams for the final evaluation (1: one continuous stream).")
    max_tokens: int | None = Field(
        None, ge=1, description="Score only the first this many tokens of each split at the end (null: the whole "
        "split, as the papers report; the experiments' smoke scales set it).")
    mc_samples: int = Field(0, ge=0, description="MC-dropout samples for the final evaluation (0: off).")
    mc_dropout_multiplier: float = Field(0.75, gt=0.0, le=1.0, description="Dropout rates are multiplied by this.")
    splits: list[Literal["valid", "test"]] = Field(["valid", "test"], description="Splits evaluated at the end.")


class SampleConfig(Section):
    num_tokens: int = Field(200, ge=0, description="Tokens sampled at the end of training (0: none).")
    temperature: float = Field(1.0, gt=0.0, description="Sampling temperature.")
    top_k: int | None = Field(None, ge=1, description="Sample among the k most likely tokens only.")
    prompt: str = Field("", description="Text the sample continues.")


#: config fields added after run directories and experiment digests first recorded configs, with their
#: defaults: a config that leaves them there is saved and digested as it was before they existed, so runs
#: made by an earlier release resume (their config.toml matches) and experiments find them (same digest)
ADDED_FIELDS: dict[str, dict[str, Any]] = {
    "data": {"source": None, "text_field": "text", "split_names": None, "tokenizer": None, "tokenizer_training": None,
             "detokenize": None},
    "model": {"orthogonal_init": None, "forget_bias": None, "weight_norm": False, "variational_input_dropout": False},
    "train": {"learning_rate_schedule": "constant", "min_learning_rate": 0.0, "adam_beta1": 0.0, "optimizer": "adam"},
    "evaluation": {"max_tokens": None},
}


#: config fields whose default changed after run directories and experiment digests recorded configs: (the new
#: default, the default recorded before). A run config holding the new default (or leaving the field out) is
#: compared and digested as holding the old one (:func:`run_identity`), so runs made by an earlier release
#: resume and experiments find them. train.cuda_graphs: null (auto) replaced false; graphed windows compute
#: what plain ones do, so a run recorded with false is the same run under auto.
CHANGED_DEFAULTS: dict[str, dict[str, tuple[Any, Any]]] = {"train": {"cuda_graphs": (None, False)}}


def without_added_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """A config mapping without the :data:`ADDED_FIELDS` that hold their defaults."""
    out = dict(config)
    for section, fields in ADDED_FIELDS.items():
        if isinstance(out.get(section), dict):
            out[section] = {k: v for k, v in out[section].items() if k not in fields or fields[k] != v}
    return out


def run_identity(config: dict[str, Any]) -> dict[str, Any]:
    """What says whether two run configs (mappings of a :class:`RunConfig`, with ``None`` values or without them,
    as TOML keeps them) are one run: without the :data:`ADDED_FIELDS` at their defaults, and with the
    :data:`CHANGED_DEFAULTS` at their new defaults (or left out) written as the old ones. The resumed run's
    comparison and the experiments' digests read it."""
    out = without_added_defaults(config)
    for section, fields in CHANGED_DEFAULTS.items():
        if isinstance(out.get(section), dict):
            out[section] = {**out[section], **{k: old for k, (new, old) in fields.items()
                                               if out[section].get(k, new) == new}}
    return out


class VersionedConfig(Section):
    """A config file's top level: its format version, checked, and its TOML form."""

    format_version: int = Field(FORMAT_VERSION, description="Config format version.")

    @model_validator(mode="after")
    def _check_version(self) -> "VersionedConfig":
        if self.format_version != FORMAT_VERSION:
            raise ValueError(f"format_version {self.format_version} is not supported (this moglm reads {FORMAT_VERSION})")
        return self

    @model_validator(mode="after")
    def _check_name(self) -> "VersionedConfig":
        """The run name names the default run directory, ``runs/<name>``: one plain folder name."""
        name = getattr(self, "name", None)
        if name is not None and (name.strip(".") == "" or "/" in name or "\\" in name or name.strip() != name):
            raise ValueError(f"name {name!r} is not a folder name: the default run directory is runs/<name>, so the "
                             "name may not be empty, '.', '..', or hold a slash")
        return self

    def to_toml(self) -> str:
        return to_toml(self.model_dump(mode="json", exclude_none=True))


class RunConfig(VersionedConfig):
    name: str | None = Field(None, description="Run name (default: the config file's name).")
    description: str | None = Field(None, description="What this config is for (shown by `moglm configs`).")
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=lambda: ModelConfig(hidden_size=256))
    train: TrainConfig = Field(default_factory=TrainConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    sample: SampleConfig = Field(default_factory=SampleConfig)


def cell_options_class(architecture: str) -> type:
    """The dataclass of ``architecture``'s own options (:attr:`moglm.modules.RecurrentModule.Options`)."""
    return ARCHITECTURES[architecture].Options


def validate_cell_options(architecture: str, cell: dict[str, Any]) -> dict[str, Any]:
    """``cell`` checked against the architecture's typed options: unknown keys and wrong types are errors
    naming the key (``"3"`` for an integer is refused; ``3`` for a float is taken as ``3.0``).
    Only the keys given are kept, so a saved config stays as the user wrote it."""
    options = cell_options_class(architecture)
    known = {f.name: f for f in dataclasses.fields(options)}
    out = {}
    for key, value in cell.items():
        if key not in known:
            raise ValueError(f"cell.{key}: unknown option for {architecture} (its options: {', '.join(known) or 'none'})")
        kind = known[key].type
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        try:
            out[key] = TypeAdapter(kind).validate_python(value, strict=True)
        except ValidationError as e:
            raise ValueError(f"cell.{key}: {e.errors()[0]['msg']} (got {value!r})") from None
    return out


# -- reading, overriding, writing --------------------------------------------------------------------
def read_mapping(path: str | Path) -> dict[str, Any]:
    """The raw mapping in a TOML or YAML file."""
    p = Path(path)
    if not p.is_file():
        raise MoglmError(f"{p}: no such config file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise MoglmError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not text.strip():
        raise MoglmError(f"{p}: config file is empty")
    try:
        data = tomllib.loads(text) if p.suffix == ".toml" else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as e:
        raise MoglmError(f"{p}: not valid {'TOML' if p.suffix == '.toml' else 'YAML'}: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise MoglmError(f"{p}: expected a mapping of sections at the top level")
    return data


def shipped_configs() -> dict[str, Path]:
    """Configs that ship with moglm, by name."""
    return {p.stem: p for p in sorted(SHIPPED.glob("*.toml"))}


def locate(config: str | Path) -> Path:
    """A path, or the name of a shipped config."""
    p = Path(config)
    if p.is_file():
        return p
    shipped = shipped_configs()
    if str(config) in shipped:
        return shipped[str(config)]
    close = did_you_mean(str(config), shipped)
    raise MoglmError(f"{config}: no such config file or shipped config{close} (shipped: {', '.join(shipped)})")


def did_you_mean(word: str, choices) -> str:
    """``"; did you mean X?"`` for the choice closest to ``word`` (difflib), or ``""``."""
    import difflib

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _keys(schema: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key of ``schema`` (sections and their fields)."""
    out = []
    for name, f in schema.model_fields.items():
        out.append(prefix + name)
        kind = f.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            out += _keys(kind, f"{prefix}{name}.")
    return out


def parse_value(raw: str) -> Any:
    """An override's value: a TOML value (``0.1``, ``true``, ``[1, 2]``, ``{rounds = 3, rank = 4}``), else a
    YAML scalar or flow collection, else the text itself (``mogrifier``)."""
    if not raw.strip():
        return None
    try:
        return tomllib.loads(f"value = {raw}")["value"]
    except tomllib.TOMLDecodeError:
        pass
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``section.key=value`` assignments (values: :func:`parse_value`). Switching ``model.architecture``
    without setting ``model.cell`` drops the file's cell options the new architecture does not have (the
    default config's ``rounds`` must not break ``--set model.architecture=lstm``)."""
    keys = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise MoglmError(f"override {item!r}: expected key=value, e.g. train.learning_rate=0.002")
        node = data
        parts = key.strip().split(".")
        keys.append(".".join(parts))
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise MoglmError(f"override {item!r}: {part} is not a section")
        node[parts[-1]] = parse_value(raw)
    model = data.get("model")
    switched = "model.architecture" in keys and not any(k == "model.cell" or k.startswith("model.cell.") for k in keys)
    if switched and isinstance(model, dict) and isinstance(model.get("cell"), dict):
        if model.get("architecture") in ARCHITECTURES:
            accepted = {f.name for f in dataclasses.fields(cell_options_class(model["architecture"]))}
            model["cell"] = {k: v for k, v in model["cell"].items() if k in accepted}
    return data


def validate(data: dict[str, Any], source: str = "config", schema: type[BaseModel] | None = None) -> Any:
    """Validate a mapping against ``schema`` (default :class:`RunConfig`); the first problem becomes a one-line
    :class:`MoglmError` naming the key."""
    try:
        return (schema or RunConfig).model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "(top level)"
        if err["type"] == "extra_forbidden":
            raise MoglmError(f"{source}: unknown key {where!r}{did_you_mean(where, _keys(schema or RunConfig))}") from None
        msg = err["msg"].removeprefix("Value error, ")
        raise MoglmError(f"{source}: {where}: {msg}") from None


def load_config(config: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """The resolved config: defaults <- file (path or shipped name) <- overrides."""
    data: dict[str, Any] = {}
    source = "config"
    if config is not None:
        path = locate(config)
        data = read_mapping(path)
        source = str(path)
        data.setdefault("name", path.stem)
    return validate(apply_overrides(data, list(overrides or [])), source)


def describe() -> str:
    """Every field with its type, default and meaning, and every architecture's cell options
    (``--help-config``)."""
    lines = [f"moglm run config, format_version {FORMAT_VERSION}"]
    for section, model in (("data", DataConfig), ("model", ModelConfig), ("train", TrainConfig),
                           ("evaluation", EvaluationConfig), ("sample", SampleConfig)):
        lines.append(f"\n[{section}]")
        for name, f in model.model_fields.items():
            default = f.default_factory() if f.default_factory else f.default
            lines.append(f"  {name} = {default!r}\n      {f.description}")
    for architecture in sorted(ARCHITECTURES):
        fields = dataclasses.fields(cell_options_class(architecture))
        lines.append(f"\n[model.cell] for architecture = {architecture!r}" + ("" if fields else ": no options"))
        for f in fields:
            kind = getattr(f.type, "__name__", None) or str(f.type).replace("typing.", "")
            lines.append(f"  {f.name} = {f.default!r}  ({kind})\n      {f.metadata.get('help', '')}")
    return "\n".join(lines)


def key_problem(key: str) -> str | None:
    """Why a dotted key (``train.learning_rate``) names no :class:`RunConfig` field; ``None`` when it does."""
    parts = key.split(".")
    model: Any = RunConfig
    for i, part in enumerate(parts):
        fields = model.model_fields
        if part not in fields:
            where = ".".join(parts[:i]) or "the config"
            return f"no such config field ({where} has: {', '.join(fields)})"
        annotation = fields[part].annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
            continue
        if typing.get_origin(annotation) is dict or (i == len(parts) - 1):
            return None  # dict-valued fields (model.cell, data.files) take any sub-key
        return f"{'.'.join(parts[: i + 1])} is not a section"
    return "names a section, not a field"
