"""A Hydra launcher that trains the jobs of a multirun that share their shapes as one model
array (hydra/launcher=fused, conf/hydra/launcher/fused.yaml): the paper's grid of learning
rates and seeds becomes one forward, one backward and one optimizer step for every finetune
of the grid (bertkit.training.model_array), each still a run of its own (bertkit.jobs.fused).

Grouping: every job's config is composed first; jobs whose configs are equal once the keys a
member may vary are left out (bertkit.jobs.fused.member_keys: the seed and the trainer keys
the array applies per member) form one group. A group of one job, and every job on a launch
of one, runs as Hydra's basic launcher runs it. A job that no array can train (another
finetuning method, early stopping, a pretraining job, ...) is refused before any job starts,
in one line naming its key.

Memory: each member's estimate is gpu_pack's (bertkit.training.throughput.job_memory, less
the process overhead, which the array pays once, plus its own model's weights, kept for its
evaluations); a group is split into arrays that fit the
device's free memory (hydra.launcher.device_memory_gib, or the GPU's), and a model that does
not fit alone is refused in one line. hydra.launcher.members_per_array caps an array.

Devices: on a CPU or one GPU the arrays run one after another in this process; with several
GPUs each array runs in a fresh process of its own on the next GPU, round-robin (gpu_pack's
slots: CUDA_VISIBLE_DEVICES set before CUDA starts, a share of the cores).

Each member's job runs its own steps inside its own Hydra job (its directory, .hydra/, log,
and failure record), twice: once to prepare it, once to finish it after the array trained.
"""

# No `from __future__ import annotations`: Hydra loads plugin modules outside sys.modules,
# where dataclasses cannot resolve string annotations, and OmegaConf reads these types.
# Hydra imports every plugin module at each start: bertkit's heavy modules load lazily.
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence  # noqa: UP035 - OmegaConf types

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from omegaconf import DictConfig, OmegaConf, open_dict

from hydra_plugins.bertkit_gpu_pack_launcher.gpu_pack_launcher import (
    GIB,
    MemoryEstimateConf,
    make_slots,
    process_for,
    read_free_memory,
    visible_gpus,
)

log = logging.getLogger("bertkit")
# Bytes per parameter of a member's own model (fp32 weights), which its job keeps beside the
# array's slice for its evaluations.
MEMBER_MODEL_BYTES = 4


@dataclass
class FusedLauncherConf:
    _target_: str = "hydra_plugins.bertkit_fused_launcher.fused_launcher.FusedLauncher"
    # The most members one array trains (null: as many as fit the device's memory).
    members_per_array: Optional[int] = field(default=None, metadata={  # noqa: UP045
        "interval": "[1, inf)", "expect": "a number of members, 1 or more, or null"})
    # Which of the visible GPUs, by index: null takes every one.
    gpus: Optional[List[int]] = field(default=None, metadata={  # noqa: UP006, UP045
        "interval": "[0, inf)", "each": True, "expect": "GPU indices, 0 or more"})
    # The memory one array may fill, in GiB: null asks each GPU for its free memory (on a CPU:
    # no split); a number splits against it, on a CPU too.
    device_memory_gib: Optional[float] = field(default=None, metadata={  # noqa: UP045
        "interval": "(0, inf)", "expect": "GiB above 0, or null to ask each GPU"})
    memory: MemoryEstimateConf = field(default_factory=MemoryEstimateConf)


ConfigStore.instance().store(group="hydra/launcher", name="bertkit_fused",
                             node=FusedLauncherConf, provider="bertkit")


def group_key(cfg: DictConfig, member_keys: Sequence[str]) -> str:
    """What must be equal for two jobs to share an array: the job's config without Hydra's
    node and without the keys a member may vary, unresolved (an interpolation of a member key
    is the same text in every member)."""
    plain = OmegaConf.to_container(cfg, resolve=False)
    plain.pop("hydra", None)
    for key in member_keys:
        node = plain
        *parents, last = key.split(".")
        for parent in parents:
            node = node.get(parent, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node.pop(last, None)
    return OmegaConf.to_yaml(OmegaConf.create(plain), sort_keys=True)


def group_jobs(configs: Sequence[DictConfig], member_keys: Sequence[str]) -> list[list[int]]:
    """The jobs' indices by group, in launch order (each group in the order of its first job)."""
    groups: dict = {}
    for index, cfg in enumerate(configs):
        groups.setdefault(group_key(cfg, member_keys), []).append(index)
    return list(groups.values())


def split_group(indices: list[int], per_array: int) -> list[list[int]]:
    """A group in arrays of at most per_array members, as even as they can be."""
    arrays = math.ceil(len(indices) / per_array)
    size = math.ceil(len(indices) / arrays)
    return [indices[start:start + size] for start in range(0, len(indices), size)]


@dataclass
class Member:
    """One job of an array: its index in the launch, its overrides and composed config."""

    idx: int
    overrides: Sequence[str]
    config: DictConfig


def member_config(hydra_context, config: DictConfig, overrides: Sequence[str],
                  idx: int) -> DictConfig:
    sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{idx}"
        sweep_config.hydra.job.num = idx
    return sweep_config


def run_step(hydra_context, member: Member, task_function) -> JobReturn:
    """One step of a member's job inside its own Hydra job (as Hydra's launchers run a job:
    its config, directory, .hydra/ files, log)."""
    HydraConfig.instance().set_config(member.config)
    return run_job(hydra_context=hydra_context, config=member.config,
                   task_function=task_function, job_dir_key="hydra.sweep.dir",
                   job_subdir_key="hydra.sweep.subdir")


def run_array(hydra_context, members: list) -> list:
    """The members prepared each in its job, trained as one array, finished each in its job;
    returns their JobReturns in order. A member that failed while prepared keeps that step's
    JobReturn (its failure is recorded); one finished already (resume=auto) returns its
    result; an array whose training fails is every remaining member's failure."""
    from bertkit.cli import run_guarded, sweeper_value
    from bertkit.jobs.fused import finish_member, prepare_member, train_group
    from bertkit.training.finetune import PreparedRun
    from bertkit.training.run import hydra_run_dir

    prepared: dict = {}

    def prepare(cfg: DictConfig):
        return run_guarded(cfg, lambda c: prepare_member(c, hydra_run_dir()))

    firsts = []
    for member in members:
        first = run_step(hydra_context, member, prepare)
        firsts.append(first)
        value = first._return_value if first.status.name == "COMPLETED" else None
        if isinstance(value, PreparedRun):
            prepared[member.idx] = value
    order = [member.idx for member in members if member.idx in prepared]
    results: dict = {}
    failure: Optional[BaseException] = None  # noqa: UP045
    if order:
        try:
            trained = train_group([prepared[idx] for idx in order])
            results = dict(zip(order, trained, strict=True))
        except Exception as err:  # noqa: BLE001 - each member's job records it
            failure = err
    returns = []
    for member, first in zip(members, firsts, strict=True):
        if member.idx not in prepared:  # failed, or finished before: its one step is the job
            if first.status.name == "COMPLETED":
                first.return_value = sweeper_value(first._return_value)
            returns.append(first)
            continue

        def finish(cfg: DictConfig, idx=member.idx):
            def work(_):
                if failure is not None:
                    raise failure
                return finish_member(prepared[idx], results[idx])
            return sweeper_value(run_guarded(cfg, work))

        returns.append(run_step(hydra_context, member, finish))
        prepared.pop(member.idx)  # its model and data go before the next member's evaluation
    return returns


def run_array_in_process(idx_overrides: list, hydra_context, config: DictConfig,
                         task_function, singleton_state: dict, slot) -> list:
    """run_array in a fresh process of gpu_pack's slot (several GPUs)."""
    import os

    import torch

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, slot.cores)
    torch.set_num_threads(len(slot.cores))
    setup_globals()
    Singleton.set_state(singleton_state)
    members = [Member(idx, overrides, member_config(hydra_context, config, overrides, idx))
               for idx, overrides in idx_overrides]
    return run_array(hydra_context, members)


class FusedLauncher(Launcher):
    def __init__(self, members_per_array: Optional[int], gpus: Optional[List[int]],  # noqa: UP006, UP045
                 device_memory_gib: Optional[float], memory: DictConfig) -> None:  # noqa: UP045
        self.members_per_array = members_per_array
        self.gpus = None if gpus is None else list(gpus)
        self.device_memory_gib = device_memory_gib
        self.memory = memory
        self.config: Optional[DictConfig] = None  # noqa: UP045
        self.hydra_context = None
        self.task_function = None

    def setup(self, *, hydra_context, task_function, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def devices(self) -> list:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            return [("cpu", None)]
        return visible_gpus(count, self.gpus)

    def members_that_fit(self, cfg: DictConfig, devices: list) -> Optional[int]:  # noqa: UP045
        """How many members of cfg's shape one array may hold on the smallest device's
        memory; None: no limit known (a CPU without device_memory_gib)."""
        from bertkit.errors import BertkitError
        from bertkit.training.throughput import job_memory

        on_gpu = devices[0][0] != "cpu"
        if self.device_memory_gib is None and not on_gpu:
            return None
        estimate = job_memory(cfg, self.memory, on_gpu)
        if estimate is None:
            log.warning("fused: no memory check: the model's config or the sequence length "
                        "is not known before the job runs")
            return None
        if self.device_memory_gib is not None:
            free, where = self.device_memory_gib * GIB, "hydra.launcher.device_memory_gib"
        else:
            by_index = read_free_memory()
            free, where = min(by_index[int(device.split(":")[1])] for device, _ in devices), \
                "free"
        overhead = estimate.process_overhead_gib * GIB
        # A member's training (gpu_pack's estimate less its process), and its own model kept
        # beside its slice of the array for its evaluations (fp32 weights: 4 bytes each).
        member = estimate.total_bytes - overhead + estimate.parameters * MEMBER_MODEL_BYTES
        fits = int((free - overhead) // member) if free > overhead else 0
        if fits < 1:
            raise BertkitError(
                f"hydra/launcher=fused: one member needs {member / GIB:.1f} GiB "
                f"({estimate.describe()}) + {overhead / GIB:.1f} GiB for the process > "
                f"{free / GIB:.1f} GiB {where}: not one fits; lower the batch, or use "
                f"another launcher")
        log.info("fused: %d member(s) of %.2f GiB fit in %.1f GiB %s", fits, member / GIB,
                 free / GIB, where)
        return fits

    def arrays(self, members: list, devices: list) -> list:
        """The launch's members in arrays: by group, each group split to fit."""
        from bertkit.jobs.fused import check_fusable, member_keys

        for member in members:
            try:
                check_fusable(member.config)
            except Exception as err:
                from bertkit.errors import BertkitError

                raise BertkitError(f"{err} [job {' '.join(filter_overrides(member.overrides))}]"
                                   ) from None
        arrays = []
        for indices in group_jobs([member.config for member in members], member_keys()):
            per_array = self.members_that_fit(members[indices[0]].config, devices)
            limit = min([cap for cap in (per_array, self.members_per_array) if cap is not None],
                        default=len(indices))
            arrays.extend([[members[i] for i in part] for part in split_group(indices, limit)])
        return arrays

    def launch(self, job_overrides: Sequence[Sequence[str]],
               initial_job_idx: int) -> Sequence[JobReturn]:
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        members = [Member(initial_job_idx + k, overrides,
                          member_config(self.hydra_context, self.config, overrides,
                                        initial_job_idx + k))
                   for k, overrides in enumerate(job_overrides)]
        devices = self.devices()
        arrays = self.arrays(members, devices)
        log.info("fused: %d job(s) in %d array(s) of %s member(s) on %s; sweep output dir: %s",
                 len(members), len(arrays), "/".join(str(len(a)) for a in arrays),
                 ", ".join(device for device, _ in devices), sweep_dir)
        returns: dict = {}
        if len(devices) == 1:
            for array in arrays:
                self.tell(array)
                if len(array) == 1:  # nothing to fuse: the job as the basic launcher runs it
                    returns[array[0].idx] = run_step(self.hydra_context, array[0],
                                                     self.task_function)
                    continue
                for member, result in zip(array, run_array(self.hydra_context, array),
                                          strict=True):
                    returns[member.idx] = result
        else:
            returns = self.launch_on_gpus(arrays, devices)
        return [returns[member.idx] for member in members]

    def tell(self, array: list) -> None:
        for member in array:
            log.info("\t#%d: %s", member.idx, " ".join(filter_overrides(member.overrides)))

    def launch_on_gpus(self, arrays: list, devices: list) -> dict:
        """Each array in a fresh process on the next GPU, as many at once as GPUs."""
        from concurrent.futures import FIRST_COMPLETED, wait

        from hydra_plugins.bertkit_gpu_pack_launcher.gpu_pack_launcher import launcher_cores

        slots = make_slots(devices, 1, launcher_cores())
        singleton_state = Singleton.get_state()
        pending, free, running, returns = list(arrays), list(range(len(slots))), {}, {}
        while pending or running:
            while pending and free:
                slot, array = free.pop(0), pending.pop(0)
                self.tell(array)
                executor = process_for(slots[slot])
                future = executor.submit(
                    run_array_in_process, [(m.idx, m.overrides) for m in array],
                    self.hydra_context, self.config, self.task_function, singleton_state,
                    slots[slot])
                running[future] = (slot, executor, array)
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                slot, executor, array = running.pop(future)
                for member, result in zip(array, future.result(), strict=True):
                    returns[member.idx] = result
                executor.shutdown(wait=False)
                free = sorted([*free, slot])
        return returns
