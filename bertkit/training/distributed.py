"""Process-rank facts for torchrun / accelerate launches, readable before torch.distributed
starts; and the same facts for a SLURM job whose tasks are the processes (submitit)."""

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


def launched() -> bool:
    """Started by a distributed launcher (torchrun, accelerate launch, deepspeed, a submitit
    job's joined tasks), even as its only process: each process is given its LOCAL_RANK,
    which is also what tells Trainer that it runs distributed."""
    return "LOCAL_RANK" in os.environ


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


def join_submitit_tasks() -> bool:
    """Inside a submitit job with several tasks (hydra/launcher=slurm_multi_gpu: one task per
    GPU), make each task one process of a data-parallel run by exporting what torchrun would:
    RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (submitit's own helper derives them
    from SLURM's variables). CUDA_VISIBLE_DEVICES is left to SLURM; Trainer picks the GPU by
    LOCAL_RANK. True when it exported them."""
    if not os.environ.get("SUBMITIT_EXECUTOR") or "RANK" in os.environ:
        return False
    import submitit

    if submitit.JobEnvironment().num_tasks < 2:
        return False
    submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    return True
