"""Batching for language modelling (Mogrifier paper section 3.3; docs/method.md "Training recipe").

* Non-episodic: the corpus is one stream, cut into ``batch_size`` stripes; windows of ``bptt`` steps
  are read in order and the final state of one window is the initial state of the next.
* Episodic: one sequence per line (ending in ``<eos>``), sequences padded to a batch and masked; the
  state starts from zero for every batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..errors import MoglmError


@dataclass
class Batch:
    """``inputs`` and ``targets`` are ``[T, B]`` token ids; ``mask`` ``[T, B]`` is 1 where a target counts
    (``None``: every target counts)."""

    inputs: Tensor
    targets: Tensor
    mask: Tensor | None = None

    def to(self, device: torch.device | str) -> "Batch":
        mask = None if self.mask is None else self.mask.to(device)
        return Batch(self.inputs.to(device), self.targets.to(device), mask)

    @property
    def num_tokens(self) -> int:
        return int(self.targets.numel() if self.mask is None else self.mask.sum())


def stripes(ids: np.ndarray | Tensor, batch_size: int) -> Tensor:
    """The stream as ``batch_size`` contiguous stripes, time-major: ``[len // batch_size, batch_size]``."""
    ids = torch.as_tensor(np.asarray(ids), dtype=torch.long)
    length = ids.numel() // batch_size
    if length < 2:
        raise MoglmError(f"{ids.numel()} tokens are too few for batch size {batch_size}")
    return ids[: length * batch_size].view(batch_size, length).t().contiguous()  # [L, B]


class StreamBatches:
    """Non-episodic BPTT windows over a stream: ``len(self)`` windows per epoch, window ``i`` covers steps
    ``[i*bptt, (i+1)*bptt)`` of every stripe (the last one may be shorter)."""

    def __init__(self, ids: np.ndarray | Tensor, batch_size: int, bptt: int) -> None:
        if bptt < 1:
            raise MoglmError(f"bptt must be >= 1, got {bptt}")
        self.data = stripes(ids, batch_size)  # [L, B]
        self.batch_size = batch_size
        self.bptt = bptt

    def __len__(self) -> int:
        return (self.data.shape[0] - 1 + self.bptt - 1) // self.bptt

    def __getitem__(self, i: int) -> Batch:
        start = i * self.bptt
        if not 0 <= start < self.data.shape[0] - 1:
            raise IndexError(i)
        end = min(start + self.bptt, self.data.shape[0] - 1)
        return Batch(self.data[start:end], self.data[start + 1 : end + 1])  # [T, B] each

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]


def split_sequences(ids: np.ndarray, eos_id: int) -> list[np.ndarray]:
    """Cut a stream after every ``eos_id``; each piece (ending in ``eos_id``) is one sequence."""
    ends = np.flatnonzero(ids == eos_id) + 1
    pieces = np.split(ids, ends)
    return [p for p in pieces if len(p)]


class EpisodicBatches:
    """One sequence per row, padded and masked. Each sequence is predicted from a leading ``eos_id``
    (so its first token is scored too). With a ``generator`` the order is reshuffled every epoch."""

    def __init__(self, ids: np.ndarray, eos_id: int, batch_size: int, max_length: int | None = None) -> None:
        self.sequences = split_sequences(np.asarray(ids), eos_id)
        if max_length is not None:
            self.sequences = [s[:max_length] for s in self.sequences]
        if not self.sequences:
            raise MoglmError("no sequences to batch")
        self.eos_id = eos_id
        self.batch_size = batch_size
        self.order = torch.arange(len(self.sequences))

    def shuffle(self, generator: torch.Generator | None = None) -> None:
        self.order = torch.randperm(len(self.sequences), generator=generator)

    def __len__(self) -> int:
        return (len(self.sequences) + self.batch_size - 1) // self.batch_size

    def __getitem__(self, i: int) -> Batch:
        rows = self.order[i * self.batch_size : (i + 1) * self.batch_size].tolist()
        if not rows:
            raise IndexError(i)
        seqs = [torch.as_tensor(self.sequences[r], dtype=torch.long) for r in rows]
        length = max(len(s) for s in seqs)
        targets = torch.zeros(length, len(seqs), dtype=torch.long)  # [T, B]
        mask = torch.zeros(length, len(seqs))  # [T, B]
        for b, s in enumerate(seqs):
            targets[: len(s), b] = s
            mask[: len(s), b] = 1.0
        inputs = torch.cat([torch.full((1, len(seqs)), self.eos_id, dtype=torch.long), targets[:-1]])  # [T, B]
        return Batch(inputs, targets, mask)

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]
