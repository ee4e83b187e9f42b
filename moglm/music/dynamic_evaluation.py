"""Dynamic evaluation of songs (Krause thesis 4.8, table 4.6): every song is read from the trained weights and a
zero state, cut into segments of ``n`` frames; each segment is scored, then the weights take one step on its mean
per-frame loss (eq. 4.2) with SGD or global RMS (eq. 4.4, without decay: "we set the decay rate to zero for these
experiments", since the weights are reset at every song anyway).

The evaluator is dynamic evaluation's own (:class:`moglm.dynamic_evaluation.DynamicEvaluator`, its divergence
guard included): the RNN-NADE keeps the stream-model contract with frames for tokens. The global RMS statistics
are the mean squared gradients of the per-frame training loss over batches of training songs
(:func:`song_gradient_rms`); the settings are searched on validation (:func:`search_songs`, the coordinate search
of thesis 4.5).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..dynamic_evaluation import DynamicEvaluator, Hyperparameters
from ..dynamic_evaluation.adapted import adapted_tensors
from ..dynamic_evaluation.evaluate import Timing
from ..dynamic_evaluation.search import coordinate_search
from ..dynamic_evaluation.statistics import rms_of_gradients
from ..dynamic_evaluation.update_rules import uses_rms
from ..errors import MoglmError
from ..progress import progress_bar
from .evaluation import SongScores, song_batch
from .model import NadeSequenceModel

#: the thesis's two rules for music (table 4.6): SGD, and global RMS (the decay is zero)
MUSIC_RULES = ("sgd", "rms")


@dataclass
class SongDynamicResult:
    """Static and dynamic scores of the same songs, per-song nll sums, the setting and the cost."""

    static: SongScores
    dynamic: SongScores
    hyperparameters: Hyperparameters
    static_per_song: list[float] = field(default_factory=list)
    dynamic_per_song: list[float] = field(default_factory=list)
    timing: Timing = field(default_factory=Timing)
    static_timing: Timing = field(default_factory=Timing)
    rollbacks: int = 0

    @property
    def gain(self) -> float:
        """Nats per frame gained by adapting (positive: dynamic is better)."""
        return self.dynamic.log_likelihood - self.static.log_likelihood

    def as_dict(self) -> dict:
        return {"hyperparameters": self.hyperparameters.as_dict(), "static": self.static.as_dict(),
                "dynamic": self.dynamic.as_dict(), "gain_per_frame": self.gain, "rollbacks": self.rollbacks,
                "seconds": self.timing.seconds, "static_seconds": self.static_timing.seconds,
                "cost": self.timing.cpu_seconds / max(self.static_timing.cpu_seconds, 1e-9)}


def song_gradient_rms(model: NadeSequenceModel, songs: list[Tensor], batch_size: int = 8,
                      progress: bool = False) -> dict[str, Tensor]:
    """Global RMS gradients by parameter name (eq. 4.4): the gradient of each batch's mean per-frame nll over
    ``batch_size`` training songs at a time, in eval mode (dropout off, as dynamic evaluation differentiates)."""
    if not songs:
        raise MoglmError("RMS statistics: no training songs")
    adapted = adapted_tensors(model)
    device = adapted.params[0].device

    def losses(m):
        for start in range(0, len(songs), batch_size):
            inputs, targets, mask = song_batch(songs[start : start + batch_size], device)
            nll, _ = m.nll(inputs, targets)  # [T, B]
            yield (nll * mask).sum() / mask.sum()

    bar = progress_bar((len(songs) + batch_size - 1) // batch_size, "RMS statistics", batch_size, enabled=progress)
    try:
        return rms_of_gradients(adapted, losses, bar.update)
    finally:
        bar.close()


def dynamic_evaluate_songs(model: NadeSequenceModel, songs: list[Tensor], hp: Hyperparameters,
                           rms: dict[str, Tensor] | None = None, progress: bool = False,
                           desc: str = "dyneval") -> SongDynamicResult:
    """Score every song statically and dynamically (module docstring); ``model`` is left unchanged."""
    if uses_rms(hp.rule) and rms is None:
        raise MoglmError(f"rule {hp.rule} needs the global RMS statistics of the training songs")
    hp = hp.with_(decay=0.0)
    was_training = model.training
    model.eval()
    timing, static_timing = Timing(), Timing()
    with timing.measure():
        evaluator = DynamicEvaluator(model, hp, rms)
    device = evaluator.params[0].device
    static_sums, dynamic_sums, frames = [], [], 0
    bar = progress_bar(len(songs), desc, 1, enabled=progress)
    try:
        for song in songs:
            inputs, targets, _ = song_batch([song], device)  # [N, 1, D] each
            with static_timing.measure(), torch.no_grad():
                static_nll, _ = model.nll(inputs, targets)  # [N, 1]
            with timing.measure():
                evaluator.reset()
                state, total = None, 0.0
                for s in range(0, len(song), hp.segment_length):
                    e = s + hp.segment_length
                    nll, state = evaluator.step(inputs[s:e], targets[s:e], state, static_nll[s:e])
                    total += float(nll.double().sum())
            static_sums.append(float(static_nll.double().sum()))
            dynamic_sums.append(total)
            frames += len(song)
            bar.update(1)
    finally:
        bar.close()
        model.train(was_training)
    return SongDynamicResult(SongScores(sum(static_sums), frames, len(songs)),
                             SongScores(sum(dynamic_sums), frames, len(songs)), hp, static_sums, dynamic_sums,
                             timing, static_timing, evaluator.rollbacks)


def start_for(rule: str) -> Hyperparameters:
    """Where the search starts for ``rule`` (``sgd`` or ``rms``), segments of 5 frames."""
    if rule not in MUSIC_RULES:
        raise MoglmError(f"music dynamic evaluation uses rule sgd or rms, got {rule!r}")
    return Hyperparameters(rule=rule, segment_length=5, decay=0.0)


def first_songs(songs: list[Tensor], frames: int) -> list[Tensor]:
    """The first ``songs`` that hold at most ``frames`` frames together (at least one song)."""
    kept, total = [], 0
    for song in songs:
        if kept and total + len(song) > frames:
            break
        kept.append(song)
        total += len(song)
    return kept


def search_songs(model: NadeSequenceModel, songs: list[Tensor], rule: str, rms: dict[str, Tensor] | None = None,
                 log: Callable[[str], None] = print,
                 start: Hyperparameters | None = None) -> tuple[Hyperparameters, list[dict]]:
    """The learning rate, segment length (and RMS eps) of ``rule`` that score ``songs`` (validation) best, by the
    coordinate search of thesis 4.5 (:func:`moglm.dynamic_evaluation.search.coordinate_search`), from ``start``
    (default :func:`start_for`)."""

    results: dict[Hyperparameters, SongDynamicResult] = {}

    def score(hp: Hyperparameters) -> tuple[float, dict]:
        results[hp] = result = dynamic_evaluate_songs(model, songs, hp, rms)
        return -result.dynamic.log_likelihood, {"log_likelihood": result.dynamic.log_likelihood,
                                                "gain": result.gain}

    start = start or start_for(rule)
    best, trials = coordinate_search(score, start, max_segment_length=20, log=log)
    gain, noise = gain_and_noise(results[best], results[start])
    if best != start and not gain > 2 * noise:  # a gain the songs' spread could give by chance is not kept
        log(f"the best searched setting ({best.label()}) gains {gain:+.4f} per frame over the start on validation, "
            f"within twice its noise ({noise:.4f}): keeping the start ({start.label()})")
        best = start
    return best, trials


def gain_and_noise(a: SongDynamicResult, b: SongDynamicResult) -> tuple[float, float]:
    """How much better ``a`` scores the same songs than ``b``, in nats per frame, and the standard error of that
    gain over the songs (each song's paired difference of summed nll, at the mean song length)."""
    diffs = [nb - na for na, nb in zip(a.dynamic_per_song, b.dynamic_per_song)]  # [songs], positive: a better
    length = a.dynamic.frames / max(len(diffs), 1)  # frames per song on average
    gain = sum(diffs) / max(a.dynamic.frames, 1)
    if len(diffs) < 2:
        return gain, math.inf
    per_song = [d / length for d in diffs]
    mean = sum(per_song) / len(per_song)
    variance = sum((x - mean) ** 2 for x in per_song) / (len(per_song) - 1)
    return gain, math.sqrt(variance / len(per_song))
