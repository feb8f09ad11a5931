"""The length-grouped training order: each epoch's drawn from seed + epoch, so that a run
resumed in a later epoch sees the uninterrupted run's batches."""

from __future__ import annotations

import random

import torch

from bertkit.training.trainer import EpochSeededLengthGroupedSampler

_RNG = random.Random(0)
LENGTHS = [_RNG.randint(5, 120) for _ in range(200)]


def order(epoch: int, seed: int = 42) -> list[int]:
    sampler = EpochSeededLengthGroupedSampler(8, lengths=LENGTHS, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


def test_an_epochs_order_depends_on_seed_and_epoch_only():
    torch.manual_seed(0)
    first = order(3)
    torch.manual_seed(1)  # a resumed run's global RNG is elsewhere at the epoch's start
    torch.rand(100)
    assert order(3) == first
    assert sorted(first) == list(range(len(LENGTHS)))
    assert order(4) != first and order(3, seed=43) != first
    # One sampler across epochs draws each epoch as a fresh one would.
    sampler = EpochSeededLengthGroupedSampler(8, lengths=LENGTHS, seed=42)
    for epoch in (0, 1, 2, 3):
        sampler.set_epoch(epoch)
        assert list(sampler) == order(epoch)


def test_batches_are_still_grouped_by_length():
    """Megabatches of 50 x 8 sorted by length: a batch's lengths are closer than at random."""
    indices = order(0)
    batches = [indices[start:start + 8] for start in range(0, len(indices), 8)]
    spread = sum(max(LENGTHS[i] for i in batch) - min(LENGTHS[i] for i in batch)
                 for batch in batches) / len(batches)
    shuffled = random.Random(1).sample(range(len(LENGTHS)), len(LENGTHS))
    random_batches = [shuffled[start:start + 8] for start in range(0, len(shuffled), 8)]
    random_spread = sum(max(LENGTHS[i] for i in batch) - min(LENGTHS[i] for i in batch)
                        for batch in random_batches) / len(random_batches)
    assert spread < random_spread / 3
