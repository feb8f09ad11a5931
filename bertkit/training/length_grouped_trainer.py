"""Trainer that groups training batches by length from the precomputed `length` column and
evaluates in dataset order.

Why a subclass: Trainer (transformers 5) drops `length` before it builds the sampler, so it
re-measures every example, and it applies length grouping to evaluation too, which shuffles
the order of predictions that prediction files rely on.
"""

from __future__ import annotations

import torch
from torch.utils.data import Sampler, SequentialSampler
from transformers.trainer_pt_utils import LengthGroupedSampler

from bertkit.training.model_card import HubTrainer


class EpochSeededLengthGroupedSampler(LengthGroupedSampler):
    """Each epoch's length-grouped order drawn from seed + epoch (Trainer calls set_epoch), as
    accelerate's SeedableRandomSampler does for Trainer's default sampler. With the global
    RNG instead, a run resumed in a later epoch would draw another order than the
    uninterrupted run: the RNG state at that epoch's start is not in the checkpoint."""

    def __init__(self, batch_size: int, lengths: list[int], seed: int):
        super().__init__(batch_size, lengths=lengths, generator=torch.Generator())
        self.seed, self.epoch = seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        self.generator.manual_seed(self.seed + self.epoch)
        return super().__iter__()


class LengthGroupedTrainer(HubTrainer):
    def _get_train_sampler(self, train_dataset=None) -> Sampler | None:
        column = self.args.length_column_name
        if (self.args.train_sampling_strategy == "group_by_length"
                and column in getattr(self.train_dataset, "column_names", [])):
            return EpochSeededLengthGroupedSampler(
                self.args.train_batch_size * self.args.gradient_accumulation_steps,
                # [:] makes a list: datasets >= 4 returns a lazy Column whose item-by-item
                # reads cost about 11 s an epoch on SST-2.
                lengths=self.train_dataset[column][:],
                seed=self.args.data_seed if self.args.data_seed is not None else self.args.seed,
            )
        return super()._get_train_sampler(train_dataset)

    def _get_eval_sampler(self, eval_dataset) -> Sampler | None:
        # None lets accelerate shard in order across processes; one process reads in order.
        return SequentialSampler(eval_dataset) if self.args.world_size <= 1 else None
