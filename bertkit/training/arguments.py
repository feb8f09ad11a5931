"""TrainingArguments for this launch, from the `trainer` config group, plus what bertkit
decides for the user: mixed precision on a GPU, DataLoader workers for the cores this process
has, where checkpoints go, Trainer's sharding options refused outside a launch, and no secret
in the training_args.bin Trainer saves. With them, the facts of the launch they run in: the
process ranks of torchrun / accelerate (readable before torch.distributed starts), the run
directory's time stamp every process agrees on, and a SLURM job's tasks joined as those
processes (submitit).
"""

from __future__ import annotations

import copy
import copyreg
import importlib.util
import logging
import os
import time
from pathlib import Path

import psutil
import torch
from omegaconf import DictConfig, OmegaConf
from transformers import TrainingArguments

from bertkit.errors import BertkitError
from bertkit.secret_masking import mask_secrets
from bertkit.training.progress import progress_bars_shown

logger = logging.getLogger(__name__)


# ================================================================================================
# TrainingArguments from the `trainer` config group, plus what bertkit decides for the user:
# mixed precision on a GPU, where checkpoints go, which tracker Trainer reports to, and no secret
# in the training_args.bin Trainer saves.

PRECISIONS = ("auto", "bf16", "fp16", "no")
CHECKPOINTS_DIR = "checkpoints"  # Trainer's output_dir, in the run directory


def resolve_mixed_precision(setting: str) -> str:
    """auto: bf16 where the GPU has it, else fp16 on a GPU, else full precision on the CPU
    (`setting` is one of PRECISIONS: the schema's choices, bertkit.config_schema)."""
    if setting != "auto":
        if setting != "no" and not torch.cuda.is_available():
            raise BertkitError(f"mixed_precision={setting}: needs a GPU, and none is visible")
        return setting
    if not torch.cuda.is_available():
        return "no"
    return "bf16" if torch.cuda.is_bf16_supported() else "fp16"


def available_cores() -> int:
    """The cores this process may run on: its CPU affinity where the system has one (a SLURM
    job's cpus_per_task, a hydra/launcher=gpu_pack job's share), else the machine's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def resolve_dataloader_workers(setting, on_gpu: bool, gpu_workers: int, cpus: int,
                               processes: int) -> int:
    """trainer.dataloader_num_workers: a number as given; auto: none on a CPU, where workers
    would take the cores training needs, and on a GPU gpu_workers, at most the cores each
    process has less one (its own)."""
    if setting == "auto":
        workers = max(0, min(int(gpu_workers), cpus // max(processes, 1) - 1)) if on_gpu else 0
        logger.info("trainer.dataloader_num_workers=auto: %d worker process(es) (%s, %d cores, "
                    "%d process(es))", workers, "GPU" if on_gpu else "CPU", cpus, processes)
        return workers
    if isinstance(setting, bool) or not isinstance(setting, int) or setting < 0:
        raise BertkitError(f"trainer.dataloader_num_workers={setting!r}: expected auto or a "
                           f"number of worker processes, 0 or more")
    return setting


# Trainer's options that shard the model over the processes of a launch: in one process
# started alone Trainer fails deep inside (FSDP: "only works in distributed training";
# DeepSpeed: an MPI lookup), so they are refused here with the command that works.
SHARDING_OPTIONS = {"fsdp": "FSDP", "deepspeed": "DeepSpeed"}


def deepspeed_installed() -> bool:
    return importlib.util.find_spec("deepspeed") is not None


def check_sharding_launch(options: dict) -> None:
    for key, name in SHARDING_OPTIONS.items():
        value = options.get(key)
        if value and not launched():
            raise BertkitError(
                f"trainer.{key}={value!r}: {name} shards the model over the processes of a "
                f"launch, and this process was started alone: launch it with torchrun, e.g. "
                f"torchrun --nproc_per_node=N -m bertkit <the same overrides> "
                f"(docs/scale.md)")
    if options.get("deepspeed") and not deepspeed_installed():
        raise BertkitError(
            f"trainer.deepspeed={options['deepspeed']!r}: DeepSpeed is not installed; it is "
            f"an optional extra: pip install 'bertkit[deepspeed]'")


class TrainingArgumentsWithoutSecrets(TrainingArguments):
    """TrainingArguments whose pickle holds its secrets masked (trainer.hub_token: Trainer
    pickles its arguments into training_args.bin beside every checkpoint and in the model
    directory it pushes). Unpickled, it is plain TrainingArguments, readable without bertkit;
    copies in this process keep the real values (Trainer's Hub calls read them)."""

    def __reduce_ex__(self, protocol):
        # pickle's own reconstructor, naming the base class: no bertkit needed to load it
        return (copyreg._reconstructor, (TrainingArguments, object, None),
                mask_secrets(self.__dict__))

    def __copy__(self):
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        return clone

    def __deepcopy__(self, memo):
        clone = object.__new__(type(self))
        memo[id(self)] = clone
        clone.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return clone


def build_training_arguments(cfg: DictConfig, run_dir: Path, report_to: list[str],
                             trainer: dict | None = None) -> TrainingArguments:
    """TrainingArguments from the trainer node (`trainer`: further options, TrainingArguments'
    names, merged over it: a benchmark's arms), mixed_precision, progress_bars and
    gpu_dataloader_workers."""
    options = OmegaConf.to_container(cfg.trainer, resolve=True)
    if trainer:  # names the trainer group may lack: merged outside its struct node
        options = OmegaConf.to_container(OmegaConf.merge(options, trainer), resolve=True)
    # auto: eager here; a finetune decides once it knows its length (decide_compile), so the
    # other callers (pretraining, a script's own job), which build their arguments here, compile
    # only when asked.
    options["torch_compile"] = options.get("torch_compile", False) is True
    check_sharding_launch(options)
    if options.get("disable_tqdm") is None:  # progress_bars decides (training.progress)
        options["disable_tqdm"] = not progress_bars_shown(cfg.progress_bars)
    precision = resolve_mixed_precision(cfg.mixed_precision)
    options["dataloader_num_workers"] = resolve_dataloader_workers(
        options.get("dataloader_num_workers", 0), torch.cuda.is_available(),
        cfg.gpu_dataloader_workers, available_cores(), world_size())
    if options["dataloader_num_workers"] == 0:
        # Prefetching and persistence are worker settings: DataLoader refuses them without.
        options.pop("dataloader_prefetch_factor", None)
        options.pop("dataloader_persistent_workers", None)
    if not torch.cuda.is_available():
        options["dataloader_pin_memory"] = False  # pinning needs a GPU; it only warns on a CPU
        if world_size() > 1:
            # Without use_cpu, accelerate opens the gloo group but reports no distributed
            # type, and each torchrun process trains alone on all the data.
            options.setdefault("use_cpu", True)
    try:
        return TrainingArgumentsWithoutSecrets(
            output_dir=str(run_dir / CHECKPOINTS_DIR),
            bf16=precision == "bf16",
            fp16=precision == "fp16",
            report_to=report_to,
            run_name=run_dir.name,
            **options,
        )
    except TypeError as err:  # an option Trainer does not know: name it as a config key
        raise BertkitError(f"trainer: {err} (the trainer group takes TrainingArguments' "
                           f"argument names)") from None
    except ValueError as err:
        raise BertkitError(f"trainer: {err}") from None


# ================================================================================================
# Process-rank facts for torchrun / accelerate launches, readable before torch.distributed
# starts; and the same facts for a SLURM job whose tasks are the processes (submitit).

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
