"""Training an RNN-NADE on a music corpus through the one training engine (:mod:`moglm.train.engine`), the
thesis's way (4.8): songs as episodes (each from a zero state), SGD with gradient-norm clipping, dropout in the
recurrent stack and on the NADE's units, validation log-likelihood per frame picking the best checkpoint.

The songs of step s come from a permutation of the training songs drawn for its epoch from a generator seeded by
the epoch (and ``train.seed``), so a step depends on the step number alone and a killed run resumes exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..device import resolve_device
from ..errors import MoglmError
from ..model.language_model import count_parameters
from ..runs import RunDirectory
from ..train.engine import Engine, Evaluation, Progress, Settings, StatelessTask, StepLoss
from .config import MusicConfig, MusicModelConfig, validate_music
from .corpus import MusicCorpus, read_music
from .evaluation import evaluate_songs, song_batch
from .model import NadeSequenceModel


def build_music_model(cfg: MusicModelConfig, visible: int = 88) -> NadeSequenceModel:
    """The RNN-NADE a config describes."""
    return NadeSequenceModel(
        cfg.hidden_size, cfg.num_layers, cfg.architecture, cfg.cell, visible, cfg.embedding_size, cfg.nade_hidden,
        cfg.activation, cfg.input_dropout, cfg.inter_layer_dropout, cfg.state_dropout, cfg.output_dropout,
        cfg.nade_dropout, cfg.backend, cfg.init)


def pieces(songs: list[Tensor], max_frames: int | None) -> list[Tensor]:
    """``songs`` cut into consecutive pieces of at most ``max_frames`` frames (``None``: the songs as they are)."""
    if max_frames is None:
        return list(songs)
    return [piece for song in songs for piece in song.split(max_frames)]


class MusicTask(StatelessTask):
    """The engine's view of a music run: the summed nll of a batch of songs, and validation per frame."""

    def __init__(self, cfg: MusicConfig, corpus: MusicCorpus, model: NadeSequenceModel, device: torch.device) -> None:
        self.cfg, self.model, self.device = cfg, model, device
        self.train_songs = pieces(corpus["train"], cfg.data.max_frames)
        self.valid_songs = corpus["valid"]
        self.per_epoch = math.ceil(len(self.train_songs) / cfg.train.batch_size)

    def songs_of_step(self, step: int) -> list[int]:
        """The training songs of step ``step`` (1-based): its slice of its epoch's permutation."""
        epoch, index = divmod(step - 1, self.per_epoch)
        generator = torch.Generator().manual_seed(self.cfg.train.seed * 1_000_003 + epoch)
        order = torch.randperm(len(self.train_songs), generator=generator)
        b = self.cfg.train.batch_size
        return order[index * b : (index + 1) * b].tolist()

    def loss(self, step: int) -> StepLoss:
        rows = self.songs_of_step(step)
        inputs, targets, mask = song_batch([self.train_songs[r] for r in rows], self.device)
        nll, _ = self.model.nll(inputs, targets)  # [T, B]
        return StepLoss((nll * mask).sum(), int(mask.sum()), len(rows))

    def validate(self, model: nn.Module) -> dict[str, float]:
        scores = evaluate_songs(model, self.valid_songs, self.cfg.evaluation.batch_size)
        return {"xent": -scores.log_likelihood, "log_likelihood": scores.log_likelihood}

    def describe(self, scores: dict[str, float]) -> str:
        return f"log-likelihood {scores['log_likelihood']:.4f} per frame"


class MusicRun(RunDirectory):
    """The run directory of a music model (``moglm music train``)."""

    midi_path_name = "sample.mid"  # the piano roll's PNG goes beside it

    def load_config(self) -> MusicConfig:
        return validate_music(self.read_config(), str(self.config_path))

    def read_corpus(self, config: MusicConfig):
        """The run's corpus, refused in one line when it changed since the run trained on it."""
        corpus = read_music(config.data.path)
        trained_on = self.model_info().get("corpus_digest") if self.model_info_path.is_file() else None
        if trained_on is not None and trained_on != corpus.digest():
            raise MoglmError(f"{self.path}: the corpus ({config.data.path}) changed since this run trained on it; its "
                             "scores would be of other songs. Restore the corpus, or train a new run")
        return corpus

    def load_model(self, which: str = "best", device: torch.device | str = "cpu") -> tuple[NadeSequenceModel,
                                                                                          MusicConfig]:
        """The model of checkpoint ``which`` (best on validation, or the last)."""
        config = self.load_config()
        return self.load_weights(build_music_model(config.model), which).to(device).eval(), config


def engine_settings(cfg: MusicConfig) -> Settings:
    t = cfg.train
    return Settings(steps=t.max_steps, learning_rate=t.learning_rate, eval_every=t.eval_every,
                    schedule=t.learning_rate_schedule, min_learning_rate=t.min_learning_rate, optimizer=t.optimizer,
                    momentum=t.momentum, adam_beta1=0.9, clip_norm=t.clip_norm, l2_penalty=t.l2_penalty,
                    averaging_patience=t.averaging_patience, averaging_start=None,
                    early_stopping_patience=t.early_stopping_patience, tokens_per_step=t.batch_size)


def train_music(cfg: MusicConfig, run_dir: str | Path, *, progress: bool = True, log: Callable[[str], None] = print,
                on_step: Callable[[int], None] | None = None,
                on_evaluation: Callable[[Evaluation], None] | None = None) -> tuple[Progress, dict[str, Any]]:
    """Train ``cfg`` in ``run_dir`` (resuming it), evaluate its best checkpoint on ``evaluation.splits``, write
    ``results.json`` and a sample (MIDI and piano roll, with the music extra). Returns the progress and results."""
    run = MusicRun(run_dir)
    with run.lock():
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        torch.manual_seed(cfg.train.seed)
        device = resolve_device(cfg.train.device)
        corpus = read_music(cfg.data.path)  # checked before the run directory is made
        model = build_music_model(cfg.model).to(device)
        model.init_output_bias(torch.cat(corpus["train"]).mean(0))  # a resumed run then loads its own weights
        run.prepare(cfg.model_dump(mode="json", exclude_none=True), "music")
        info = {"num_params": count_parameters(model), "hidden_size": cfg.model.hidden_size,
                "nade_hidden": cfg.model.nade_hidden, "corpus_digest": corpus.digest()}
        run.write_model_info(info)
        log(corpus.summary())
        log(f"model: {cfg.model.architecture}-NADE, {cfg.model.num_layers} x {cfg.model.hidden_size}, NADE "
            f"{cfg.model.nade_hidden}: {info['num_params']:,} parameters")
        task = MusicTask(cfg, corpus, model, device)
        engine = Engine(task, engine_settings(cfg), run, device=device, title=cfg.name or run.path.name, unit="nats",
                        progress=progress, desc="music", log=log, on_step=on_step, on_evaluation=on_evaluation,
                        hparams=cfg.model_dump(mode="json", exclude={"description"}))
        trained = engine.fit()
        model.load_state_dict(engine.best_weights())
        results: dict[str, Any] = {"num_params": info["num_params"], "best_step": trained.best_step,
                                   "train_seconds": trained.seconds, "splits": {}}
        for split in cfg.evaluation.splits:
            scores = evaluate_songs(model, corpus[split], cfg.evaluation.batch_size, progress, split)
            results["splits"][split] = scores.as_dict()
            log(f"{split}: log-likelihood {scores.log_likelihood:.4f} per frame ({scores.frames:,} frames, "
                f"{scores.songs} songs)")
        run.write_json(run.results_path, results)
        if cfg.sample.num_frames:
            write_sample(run, model, cfg, cfg.train.seed, log=log)
        return trained, results


def sample_paths(run: MusicRun, output: Path | None, force: bool = False) -> tuple[Path, Path]:
    """Where a sample goes: the MIDI file (``output``, a ``.mid``/``.midi`` name, else the run's ``sample.mid``)
    and the piano roll's PNG beside it. A user's ``output`` that exists, or whose PNG exists, is refused unless
    ``force``: the sample never replaces a file the user did not name for it."""
    from ..atomic import check_free

    if output is None:
        midi = run.path / run.midi_path_name
        return midi, midi.with_suffix(".png")
    midi = Path(output)
    if midi.suffix.lower() not in (".mid", ".midi"):
        raise MoglmError(f"{midi}: a music sample is a MIDI file; give --output a .mid name")
    png = midi.with_suffix(".png")
    for path in (midi, png):
        check_free(path, force)
    return midi, png


def write_sample(run: MusicRun, model: NadeSequenceModel, cfg: MusicConfig, seed: int | None,
                 output: Path | None = None, num_frames: int | None = None, temperature: float | None = None,
                 log: Callable[[str], None] = print, force: bool = False) -> tuple[Path, Path] | None:
    """Sample frames and write them as a MIDI file and a piano-roll PNG (``output``: the MIDI path, default the
    run's ``sample.mid``; the PNG goes beside it; existing files only with ``force``, see :func:`sample_paths`).
    Without the music extra, says so and writes nothing."""
    from .midi import write_midi
    from .piano_roll import plot_piano_roll

    temperature = cfg.sample.temperature if temperature is None else temperature
    if not (math.isfinite(temperature) and temperature > 0):
        raise MoglmError(f"temperature must be a finite number > 0, got {temperature}")
    midi, png = sample_paths(run, output, force)
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    frames = num_frames if num_frames is not None else cfg.sample.num_frames
    roll = model.sample(frames, generator=generator, temperature=temperature).cpu()
    if output is not None:  # checked again just before writing, after the sampling
        sample_paths(run, output, force)
    try:
        write_midi(roll, midi, seconds_per_frame=cfg.sample.seconds_per_frame)
        plot_piano_roll(roll, png, title=f"{cfg.name or run.path.name}: {frames} sampled frames")
    except MoglmError as e:
        log(f"sample not written: {e}")
        return None
    log(f"sample: {midi} and {png} ({int(roll.sum())} notes over {frames} frames)")
    return midi, png
