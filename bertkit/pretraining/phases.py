"""The order in which pretraining sees its instances: the paper's sequence-length phases.

BERT trains 90% of its steps on sequences of 128 tokens and the last 10% on 512 (Devlin et
al. 2019, A.2), in one learning-rate schedule. The instances of both lengths sit in one
dataset; this sampler draws the first phase's share of the run from the first part, then the
second's from the second part, each pass over a part reshuffled. One Trainer run, so the
schedule, the logs and resumption are continuous across the switch.

The order within a phase is a plain shuffle, as Google's code draws it, wherever batches have
their phase's length anyway (a GPU, or compiled: bertkit.training.static_shapes) or are packed
(bertkit.pretraining.padding_free). Only on an eager CPU, where a batch is padded to its longest
row and shapes are free, is each pass grouped by length (short instances together, so little
compute goes to padding): batches then hold instances of similar length rather than a random
draw of lengths, the gradient of each step is the mean over a less varied batch (the same
instances over a pass).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch.utils.data import Sampler
from transformers.trainer_pt_utils import get_length_grouped_indices


@dataclass(frozen=True)
class Phase:
    offset: int          # where the phase's instances start in the concatenated dataset
    lengths: Sequence[int]
    num_samples: int     # instances the phase feeds to the model (all processes together)


def phase_steps(max_steps: int, long_share: float) -> tuple[int, int]:
    """Optimizer steps of the short and the long phase."""
    long_steps = int(round(max_steps * long_share))
    return max_steps - long_steps, long_steps


class PhasedSampler(Sampler[int]):
    """Yields indices phase after phase; lazily, since 1M steps x 256 is 256M indices.

    group_by_length: consecutive runs of `batch_size` indices have similar lengths (an eager
    CPU's order); else a plain shuffle. Deterministic for a seed, which is what Trainer needs
    to skip the consumed batches on resumption.
    """

    def __init__(self, phases: Sequence[Phase], batch_size: int, seed: int,
                 group_by_length: bool = True):
        self.phases = [phase for phase in phases if phase.num_samples > 0]
        self.batch_size = batch_size
        self.seed = seed
        self.group_by_length = group_by_length

    def __len__(self) -> int:
        return sum(phase.num_samples for phase in self.phases)

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator()
        generator.manual_seed(self.seed)
        for phase in self.phases:
            remaining = phase.num_samples
            while remaining > 0:
                order = get_length_grouped_indices(phase.lengths, self.batch_size,
                                                   generator=generator) \
                    if self.group_by_length else \
                    torch.randperm(len(phase.lengths), generator=generator).tolist()
                for index in order[:remaining]:
                    yield phase.offset + index
                remaining -= min(remaining, len(order))
