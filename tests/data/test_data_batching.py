"""Batching: stripes and BPTT windows over one stream; padded, masked episodes."""

from __future__ import annotations

import numpy as np
import torch

from moglm.data import EpisodicBatches, StreamBatches, split_sequences, stripes


def test_stripes_are_contiguous_and_time_major():
    s = stripes(np.arange(23), 4)  # 5 steps x 4 stripes, 3 tokens dropped
    assert s.shape == (5, 4)
    assert s[:, 1].tolist() == [5, 6, 7, 8, 9]


def test_windows_cover_every_stripe_in_order_with_targets_shifted_by_one():
    batches = StreamBatches(np.arange(40), batch_size=2, bptt=6)  # stripes of 20
    inputs = torch.cat([b.inputs for b in batches])
    targets = torch.cat([b.targets for b in batches])
    assert len(batches) == 4 and [b.inputs.shape[0] for b in batches] == [6, 6, 6, 1]
    assert inputs[:, 0].tolist() == list(range(19)) and targets[:, 0].tolist() == list(range(1, 20))
    assert inputs[:, 1].tolist() == list(range(20, 39))


def test_episodes_are_padded_masked_and_start_from_the_separator():
    ids = np.array([5, 6, 0, 7, 0, 8, 9, 9, 0])  # 0 = <eos>
    assert [s.tolist() for s in split_sequences(ids, 0)] == [[5, 6, 0], [7, 0], [8, 9, 9, 0]]
    batches = EpisodicBatches(ids, 0, batch_size=2)
    b = batches[0]
    assert b.inputs[:, 0].tolist() == [0, 5, 6] and b.targets[:, 0].tolist() == [5, 6, 0]
    assert b.targets[:, 1].tolist()[:2] == [7, 0] and b.mask[:, 1].tolist() == [1, 1, 0]
    assert b.num_tokens == 5
    batches.shuffle(torch.Generator().manual_seed(0))
    assert sorted(batches.order.tolist()) == [0, 1, 2]
