"""Process-rank facts for torchrun / accelerate launches, readable before torch.distributed
starts."""

from __future__ import annotations

import os
import time

import psutil


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def is_main_process() -> bool:
    return rank() == 0


def run_stamp() -> str:
    """A time stamp for the run directory that every process of one launch agrees on.

    Each torchrun worker composes its own Hydra config, and their clocks may tick over a
    second apart; the launcher (their common parent) started once, so its start time is shared.
    BERTKIT_RUN_STAMP overrides both, e.g. for multi-node launches.
    """
    if os.environ.get("BERTKIT_RUN_STAMP"):
        return os.environ["BERTKIT_RUN_STAMP"]
    started = time.time()
    if world_size() > 1:
        started = psutil.Process(os.getppid()).create_time()
    return time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(started))
