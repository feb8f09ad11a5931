"""The two-phase sampler: phase order, share of steps, length grouping, determinism."""

from __future__ import annotations

import numpy as np

from bertkit.pretraining.batches import Phase, PhasedSampler, phase_steps


def test_phase_steps_split_the_run():
    assert phase_steps(1_000_000, 0.1) == (900_000, 100_000)
    assert phase_steps(10, 0.0) == (10, 0)
    assert phase_steps(7, 0.1) == (6, 1)


def test_phases_in_order_with_their_sample_counts():
    rng = np.random.default_rng(0)
    short = rng.integers(10, 129, size=50)
    long = rng.integers(100, 513, size=20)
    phases = [Phase(0, short, 4 * 40), Phase(50, long, 4 * 5)]
    sampler = PhasedSampler(phases, batch_size=4, seed=3)
    order = list(sampler)
    assert len(order) == len(sampler) == 180
    first, second = order[:160], order[160:]
    assert all(0 <= i < 50 for i in first) and all(50 <= i < 70 for i in second)
    # 160 samples from 50 instances: three full passes, then 10 of a fourth.
    counts = np.bincount(first, minlength=50)
    assert counts.min() >= 3 and counts.max() <= 4 and counts.sum() == 160
    # Each pass is a permutation (every instance once per pass).
    assert sorted(first[:50]) == list(range(50))
    assert list(sampler) == order  # deterministic for a seed
    assert list(PhasedSampler(phases, batch_size=4, seed=4)) != order


def test_batches_are_grouped_by_length():
    lengths = np.random.default_rng(1).integers(5, 129, size=4000)
    sampler = PhasedSampler([Phase(0, lengths, 4000)], batch_size=32, seed=0)
    order = np.array(list(sampler))
    batches = lengths[order].reshape(-1, 32)
    grouped_padding = (batches.max(1, keepdims=True) - batches).sum()
    shuffled = lengths[np.random.default_rng(2).permutation(4000)].reshape(-1, 32)
    random_padding = (shuffled.max(1, keepdims=True) - shuffled).sum()
    assert grouped_padding < 0.1 * random_padding


def test_empty_phase_is_skipped():
    sampler = PhasedSampler([Phase(0, [5, 6, 7], 6), Phase(3, [9], 0)], 2, seed=0)
    assert len(sampler) == 6 and set(sampler) == {0, 1, 2}
