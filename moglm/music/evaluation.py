"""Scoring songs: the log-likelihood per frame (Krause thesis table 4.6; Boulanger-Lewandowski et al. 2012), each
song read from a zero state and its first frame predicted from silence.

Songs are padded side by side; :func:`song_batch` builds the previous-frame inputs, the targets and the mask of
real frames, which training shares.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..progress import progress_bar


@dataclass
class SongScores:
    """Summed negative log-likelihood over ``frames`` frames of ``songs`` songs."""

    nll: float
    frames: int
    songs: int

    @property
    def log_likelihood(self) -> float:
        """Mean log-likelihood per frame (nats), as table 4.6 reports it."""
        return -self.nll / max(self.frames, 1)

    def as_dict(self) -> dict:
        return {"log_likelihood_per_frame": self.log_likelihood, "nll_per_frame": -self.log_likelihood,
                "frames": self.frames, "songs": self.songs}


def song_batch(songs: list[Tensor], device: torch.device | str = "cpu") -> tuple[Tensor, Tensor, Tensor]:
    """Padded ``inputs`` ``[T, B, D]`` (each song's previous frames, silence first), ``targets`` ``[T, B, D]`` and
    ``mask`` ``[T, B]`` (1 on real frames) of songs ``[T_b, D]``."""
    length, visible = max(len(s) for s in songs), songs[0].shape[1]
    targets = torch.zeros(length, len(songs), visible)  # [T, B, D]
    mask = torch.zeros(length, len(songs))  # [T, B]
    for b, song in enumerate(songs):
        targets[: len(song), b] = song
        mask[: len(song), b] = 1.0
    inputs = torch.cat([torch.zeros(1, len(songs), visible), targets[:-1]])  # [T, B, D]
    return inputs.to(device), targets.to(device), mask.to(device)


@torch.no_grad()
def evaluate_songs(model: nn.Module, songs: list[Tensor], batch_size: int = 16, progress: bool = False,
                   desc: str = "evaluate") -> SongScores:
    """The summed nll of every frame of ``songs`` under ``model`` (eval mode), ``batch_size`` songs at a time
    (sorted by length, so little is padding)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    order = sorted(range(len(songs)), key=lambda i: len(songs[i]))
    total, frames = 0.0, 0
    bar = progress_bar(len(songs), desc, 1, enabled=progress)
    try:
        for start in range(0, len(order), batch_size):
            chunk = [songs[i] for i in order[start : start + batch_size]]
            inputs, targets, mask = song_batch(chunk, device)
            nll, _ = model.nll(inputs, targets)  # [T, B]
            total += float((nll * mask).double().sum())
            frames += int(mask.sum())
            bar.update(len(chunk))
    finally:
        bar.close()
        model.train(was_training)
    return SongScores(total, frames, len(songs))
