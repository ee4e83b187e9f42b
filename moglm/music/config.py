"""The config of a music run (``moglm music train``): typed, documented, versioned, like a language model's
(:mod:`moglm.runs.config`, whose reading, overrides and one-line errors it shares).

A music config is a TOML or YAML file with ``kind = "music"`` and the sections below; the shipped ones are in
``moglm/music/configs`` (``moglm music configs`` lists them). Defaults follow the thesis's LSTM-NADE (4.8): SGD
with gradient-norm clipping, dropout between the layers and on the NADE's hidden units.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from ..errors import MoglmError
from ..model.architectures import is_recurrent
from ..modules import ARCHITECTURES
from ..runs.config import Section, VersionedConfig, WithCellOptions, apply_overrides, read_mapping, validate
from .nade import ACTIVATIONS

SHIPPED = Path(__file__).resolve().parent / "configs"


class MusicDataConfig(Section):
    path: str = Field("jsb-chorales", description="A music corpus: a .json or .pkl file of train/valid/test songs "
                      "(the Boulanger-Lewandowski format), a folder holding one, or a folder with train/, valid/ and "
                      "test/ folders of MIDI files. Relative paths are also looked up in $MOGLM_DATA.")
    max_frames: int | None = Field(None, ge=2, description="Training cuts songs longer than this into pieces of at "
                                   "most this many frames, each read from a zero state (null: whole songs). "
                                   "Evaluation always reads whole songs.")


class MusicModelConfig(WithCellOptions):
    architecture: str = Field("lstm", description=f"The recurrent part: one of {sorted(ARCHITECTURES)}.")
    num_layers: int = Field(2, ge=1, description="Recurrent layers.")
    hidden_size: int = Field(300, ge=1, description="Hidden units per layer.")
    embedding_size: int | None = Field(None, ge=1, description="The linear embedding of a frame (null: hidden_size).")
    nade_hidden: int = Field(150, ge=1, description="The NADE's hidden units (thesis 4.8: 400).")
    activation: Literal[ACTIVATIONS] = Field(
        "relu", description="The NADE's hidden activation: relu, the thesis's (eq. 2.62), or sigmoid, Boulanger-"
        "Lewandowski et al. (2012)'s and Larochelle and Murray (2011)'s.")
    cell: dict[str, Any] = Field(default_factory=dict, description="The architecture's own options, as "
                                 "[model.cell] of a language model's config (moglm train --help-config lists them).")
    init: Literal["torch", "paper"] = Field("paper", description="Initialisation of the recurrent stack.")
    input_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the frame embedding.")
    inter_layer_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout between the recurrent layers.")
    state_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Variational dropout on h_prev.")
    output_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the stack's output.")
    nade_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the NADE's hidden units, one mask per "
                                "frame (thesis 4.8).")
    backend: Literal["auto", "compiled", "fused", "reference"] = Field("auto", description="Time-loop implementation.")

    @field_validator("architecture")
    @classmethod
    def _check_architecture(cls, architecture: str) -> str:
        if not is_recurrent(architecture):
            raise ValueError(f"architecture must be one of {sorted(ARCHITECTURES)}, got {architecture!r}")
        return architecture


class MusicTrainConfig(Section):
    optimizer: Literal["sgd", "adam"] = Field("sgd", description="SGD with clipping (the thesis's) or Adam.")
    learning_rate: float = Field(0.05, gt=0.0, description="Learning rate of the summed loss per song.")
    learning_rate_schedule: Literal["constant", "linear"] = Field("constant", description="constant, or linear "
                                                                  "from learning_rate to min_learning_rate.")
    min_learning_rate: float = Field(0.0, ge=0.0, description="The linear schedule's learning rate at the last step.")
    momentum: float = Field(0.0, ge=0.0, lt=1.0, description="SGD's momentum.")
    batch_size: int = Field(16, ge=1, description="Songs (or pieces of songs) per step.")
    max_steps: int = Field(2000, ge=1, description="Optimizer steps.")
    clip_norm: float = Field(5.0, gt=0.0, description="Global gradient-norm clip.")
    l2_penalty: float = Field(0.0, ge=0.0, description="l2_penalty * 0.5 * sum(w^2) added to the step's loss.")
    eval_every: int = Field(100, ge=1, description="Validate (and checkpoint) every this many steps.")
    averaging_patience: int | None = Field(None, ge=1, description="Start weight averaging after this many "
                                           "evaluations without improvement (null: never).")
    early_stopping_patience: int | None = Field(None, ge=1, description="Stop after this many evaluations "
                                                "without improvement (null: never).")
    seed: int = Field(1, ge=0, le=2**63 - 1, description="Random seed (weights, dropout masks, song order), 0 to "
                      "2^63 - 1.")
    device: str = Field("auto", description="auto (CUDA when available), cpu, cuda or cuda:N.")
    threads: int | None = Field(None, ge=1, description="CPU threads for torch (null: torch's default).")


class MusicEvaluationConfig(Section):
    batch_size: int = Field(16, ge=1, description="Songs scored side by side (static evaluation).")
    splits: list[Literal["valid", "test"]] = Field(["valid", "test"], description="Splits evaluated at the end.")


class MusicSampleConfig(Section):
    num_frames: int = Field(64, ge=0, description="Frames sampled at the end of training (0: none).")
    temperature: float = Field(1.0, gt=0.0, description="Sampling temperature of every NADE unit.")
    seconds_per_frame: float = Field(0.5, gt=0.0, description="Frame length in the written MIDI file.")


class MusicConfig(VersionedConfig):
    kind: Literal["music"] = Field("music", description="Marks a music config.")
    name: str | None = Field(None, description="Run name (default: the config file's name).")
    description: str | None = Field(None, description="What this config is for.")
    data: MusicDataConfig = Field(default_factory=MusicDataConfig)
    model: MusicModelConfig = Field(default_factory=MusicModelConfig)
    train: MusicTrainConfig = Field(default_factory=MusicTrainConfig)
    evaluation: MusicEvaluationConfig = Field(default_factory=MusicEvaluationConfig)
    sample: MusicSampleConfig = Field(default_factory=MusicSampleConfig)


def shipped_music_configs() -> dict[str, Path]:
    """The music configs that ship with moglm, by name."""
    return {p.stem: p for p in sorted(SHIPPED.glob("*.toml"))}


def validate_music(data: dict[str, Any], source: str = "config") -> MusicConfig:
    return validate(data, source, MusicConfig)


def load_music_config(config: str | Path, overrides: list[str] | None = None) -> MusicConfig:
    """The resolved music config: defaults <- file (a path or a shipped music config's name) <- overrides."""
    path = Path(config)
    if not path.is_file():
        shipped = shipped_music_configs()
        if str(config) not in shipped:
            from ..runs.config import did_you_mean

            raise MoglmError(f"{config}: no such config file or shipped music config{did_you_mean(str(config), shipped)} "
                             f"(shipped: {', '.join(shipped)})")
        path = shipped[str(config)]
    data = read_mapping(path)
    data.setdefault("name", path.stem)
    return validate_music(apply_overrides(data, list(overrides or [])), str(path))


def is_music_config(mapping: dict[str, Any]) -> bool:
    """Whether a run directory's saved config is a music run's."""
    return mapping.get("kind") == "music"
