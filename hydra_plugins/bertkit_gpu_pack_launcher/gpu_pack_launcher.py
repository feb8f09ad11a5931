"""A Hydra launcher that runs several jobs of a multirun at once on each GPU
(hydra/launcher=gpu_pack, conf/hydra/launcher/gpu_pack.yaml): hydra.launcher.jobs_per_gpu
jobs share one GPU, the GPUs are taken round-robin, and on a CPU-only machine jobs_per_gpu
jobs run side by side. Built for the paper's grid: many small finetunes that each use a few
percent of a GPU.

Why a launcher of its own and not hydra-joblib-launcher (hydra/launcher=local_parallel):
joblib hands jobs to a pool of loky workers that it reuses from job to job, so a job cannot
be told its GPU before CUDA starts in its process (a reused worker has already opened the GPU
of an earlier job), and which worker takes which job is joblib's choice. Here every job gets
a fresh process from the same machinery, a one-worker loky executor (joblib's process
backend, cloudpickle for Hydra's task function and context), created with its environment
set before Python starts: CUDA_VISIBLE_DEVICES names its GPU, OMP_NUM_THREADS (and MKL's,
tokenizers' RAYON_NUM_THREADS) its share of the threads. Its share of the cores is also its
CPU affinity, from which bertkit counts the cores its dataloader workers may take
(trainer.dataloader_num_workers=auto, bertkit.training.run). A job leaves its slot (one
GPU, one share of the cores) when its process ends, and the next job takes the free slot.

Before any job starts, every job's config is composed and its memory estimated
(bertkit.training.throughput): a packing that cannot fit is refused in one line with the
numbers. The GPUs' free memory is read in a short-lived process (reading it here would hold a
CUDA context on every GPU for the whole sweep), or taken from hydra.launcher.device_memory_gib.

Each launch is recorded in <sweep dir>/gpu_pack.json: every job's device, cores, threads,
process and start and end times, as the job's own process saw them. The halving sweeper
launches each rung through this launcher, so a halving sweep packs the same way.
"""

# No `from __future__ import annotations`: Hydra loads plugin modules outside sys.modules,
# where dataclasses cannot resolve string annotations, and OmegaConf reads these types.
# Hydra imports every plugin module at each start: bertkit's heavy modules load lazily.
import logging
import math
import os
import time
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence  # noqa: UP035 - OmegaConf types

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger("bertkit")
GIB = 1024**3


# Each parameter's range ("interval", as bertkit.config_schema writes them) and the message's
# wording ("expect"): bertkit checks them before Hydra instantiates the launcher
# (bertkit.config_schema.check_launch), as one line naming the key.
@dataclass
class MemoryEstimateConf:
    # Bytes each parameter holds in training: fp32 weights (4), gradients (4), AdamW's two
    # moments (8). Other optimizers hold less (SGD with momentum: 12).
    bytes_per_parameter: float = field(default=16.0, metadata={"interval": "(0, inf)"})
    # Activation values kept for the backward pass, per token, per layer, per hidden unit:
    # Korthikanti et al. 2022 (arXiv 2205.05198, eq. 1) count 34 bytes at 16 bits, i.e. 17
    # values, for a transformer layer with a 4x hidden MLP when the attention scores are not
    # stored (fused attention); each value 2 bytes under mixed precision, 4 in fp32.
    activation_values_per_hidden_unit: float = field(default=17.0,
                                                     metadata={"interval": "(0, inf)"})
    # Held by each job's process whatever it trains: the CUDA context (about 0.5 GiB),
    # cuBLAS/cuDNN workspaces and the caching allocator's reserve.
    process_overhead_gib: float = field(default=1.0, metadata={"interval": "[0, inf)"})
    # A job's sequence length: the longest of these keys it has.
    sequence_length_keys: List[str] = field(default_factory=lambda: [  # noqa: UP006
        "task.max_seq_length", "pretraining.max_seq_length",
        "pretraining.long_phase.max_seq_length"])
    # Sequences per example by task.family (SWAG feeds each example's four endings).
    sequences_per_example: Dict[str, int] = field(  # noqa: UP006
        default_factory=lambda: {"swag": 4}, metadata={"interval": "[1, inf)", "each": True})


@dataclass
class GpuPackLauncherConf:
    _target_: str = (
        "hydra_plugins.bertkit_gpu_pack_launcher.gpu_pack_launcher.GpuPackLauncher")
    # Jobs sharing one GPU at once; on a CPU-only machine, jobs at once.
    jobs_per_gpu: int = field(default=2, metadata={
        "interval": "[1, inf)", "expect": "a number of jobs sharing one GPU, 1 or more"})
    # Which of the visible GPUs (indices into CUDA_VISIBLE_DEVICES, or all the machine's):
    # null: every one.
    gpus: Optional[List[int]] = field(default=None, metadata={  # noqa: UP006, UP045
        "interval": "[0, inf)", "each": True, "expect": "GPU indices, 0 or more"})
    # The memory a packing may fill on each GPU, in GiB: null asks each GPU for its free
    # memory (on a CPU: no check); a number checks against it, on a CPU too.
    device_memory_gib: Optional[float] = field(default=None, metadata={  # noqa: UP045
        "interval": "(0, inf)", "expect": "GiB above 0, or null to ask each GPU"})
    memory: MemoryEstimateConf = field(default_factory=MemoryEstimateConf)


ConfigStore.instance().store(group="hydra/launcher", name="bertkit_gpu_pack",
                             node=GpuPackLauncherConf, provider="bertkit")


@dataclass(frozen=True)
class Slot:
    """Where one running job goes: a device and a share of the launcher's cores."""

    device: str  # cuda:<index among the launcher's visible GPUs>, or cpu
    gpu: Optional[str]  # noqa: UP045 - what CUDA_VISIBLE_DEVICES says in the job's process
    cores: tuple

    def environment(self) -> dict[str, str]:
        threads = str(len(self.cores))
        env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
               "RAYON_NUM_THREADS": threads}
        if self.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.gpu
        return env


def launcher_cores() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def make_slots(devices: list[tuple[str, Optional[str]]], jobs_per_gpu: int,  # noqa: UP045
               cores: list[int]) -> list[Slot]:
    """jobs_per_gpu slots per device, in round-robin order (cuda:0, cuda:1, cuda:0, ...), so
    that the first jobs spread over the GPUs; the cores split evenly among all slots (each
    at least one: with more slots than cores, slots share cores)."""
    pairs = [device for _ in range(jobs_per_gpu) for device in devices]
    share = max(1, len(cores) // len(pairs))
    return [Slot(device, gpu, tuple(cores[(k * share + i) % len(cores)] for i in range(share)))
            for k, (device, gpu) in enumerate(pairs)]


def visible_gpus(count: int, chosen: Optional[List[int]]) -> list[tuple[str, str]]:  # noqa: UP006, UP045
    """(cuda:<i>, its name for CUDA_VISIBLE_DEVICES) for each chosen GPU of this process."""
    from bertkit.errors import BertkitError

    names = [name.strip() for name in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
             if name.strip()] or [str(i) for i in range(count)]
    names = names[:count]
    indices = list(range(count)) if chosen is None else list(chosen)
    for index in indices:
        if not 0 <= index < count:
            raise BertkitError(f"hydra.launcher.gpus={list(chosen)}: GPU {index} is not one of "
                               f"the {count} this process sees (0 to {count - 1})")
    return [(f"cuda:{index}", names[index]) for index in indices]


def free_memory_of_gpus() -> list[int]:
    """Each visible GPU's free bytes, read in the process that calls it."""
    import torch

    return [torch.cuda.mem_get_info(index)[0] for index in range(torch.cuda.device_count())]


def read_free_memory() -> list[int]:
    """free_memory_of_gpus in a process of its own, which exits with its CUDA contexts."""
    from joblib.externals.loky import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1) as executor:
        return executor.submit(free_memory_of_gpus).result()


def preload() -> None:
    """What every job imports, loaded while the process waits for its job."""
    import bertkit.cli  # noqa: F401


def process_for(slot: Slot):
    """A one-worker loky executor whose process starts with the slot's environment (set
    before Python starts, so before CUDA can) and imports bertkit at once."""
    from joblib.externals.loky import ProcessPoolExecutor

    executor = ProcessPoolExecutor(max_workers=1, env=slot.environment())
    executor.submit(preload)
    return executor


def run_packed_job(idx: int, overrides: Sequence[str], hydra_context, config: DictConfig,
                   task_function, singleton_state: dict, slot: Slot) -> tuple:
    """One job in its own fresh process, set up as Hydra's launchers set up a job; returns
    its JobReturn and what the process saw (for gpu_pack.json)."""
    started = time.time()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, slot.cores)
    import torch

    torch.set_num_threads(len(slot.cores))
    setup_globals()
    Singleton.set_state(singleton_state)
    sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{idx}"
        sweep_config.hydra.job.num = idx
    HydraConfig.instance().set_config(sweep_config)
    result = run_job(hydra_context=hydra_context, config=sweep_config,
                     task_function=task_function, job_dir_key="hydra.sweep.dir",
                     job_subdir_key="hydra.sweep.subdir")
    record = {
        "job": idx, "overrides": list(filter_overrides(overrides)), "device": slot.device,
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"), "pid": os.getpid(),
        "cores": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
        else list(slot.cores),
        "threads": torch.get_num_threads(), "started": started, "ended": time.time()}
    return result, record


class GpuPackLauncher(Launcher):
    def __init__(self, jobs_per_gpu: int, gpus: Optional[List[int]],  # noqa: UP006, UP045
                 device_memory_gib: Optional[float], memory: DictConfig) -> None:  # noqa: UP045
        self.jobs_per_gpu = jobs_per_gpu
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

    def devices(self) -> list[tuple[str, Optional[str]]]:  # noqa: UP045
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            return [("cpu", None)]
        return visible_gpus(count, self.gpus)

    def check_memory(self, job_overrides: Sequence[Sequence[str]],
                     devices: list[tuple[str, Optional[str]]]) -> None:  # noqa: UP045
        """Refuse, before any job starts, jobs_per_gpu jobs (the largest one's estimate each)
        that would not fit in one device's free memory."""
        from bertkit.errors import BertkitError
        from bertkit.training.throughput import job_memory, memory_kind

        on_gpu = devices[0][0] != "cpu"
        if self.device_memory_gib is None and not on_gpu:
            return  # a CPU's memory is the machine's: nothing to ask
        at_once = min(self.jobs_per_gpu, math.ceil(len(job_overrides) / len(devices)))
        if at_once < 2:
            return  # one job per device packs nothing
        counted: dict = {}
        estimates = []
        groups = set(self.config.hydra.runtime.choices)
        kinds = {memory_kind(list(overrides), groups): overrides for overrides in job_overrides}
        for overrides in kinds.values():
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config,
                                                                     list(overrides))
            choice = OmegaConf.select(cfg, "hydra.runtime.choices.model", default=None)
            estimate = job_memory(cfg, self.memory, on_gpu,
                                  f"model={choice}" if choice else None, counted)
            if estimate is None:
                log.warning("gpu_pack: no memory check: the model's config or the sequence "
                            "length of job %s is not known before it runs",
                            " ".join(filter_overrides(overrides)))
                return
            estimates.append(estimate)
        largest = max(estimates, key=lambda estimate: estimate.total_bytes)
        if self.device_memory_gib is not None:
            free = {device: self.device_memory_gib * GIB for device, _ in devices}
            where = "hydra.launcher.device_memory_gib"
        else:
            by_index = read_free_memory()
            free = {device: by_index[int(device.split(":")[1])] for device, _ in devices}
            where = "free"
        device = min(free, key=free.get)
        need = at_once * largest.total_bytes
        if need > free[device]:
            fits = int(free[device] // largest.total_bytes)
            fit = f"at most {fits} fit" if fits else "not one fits"
            raise BertkitError(
                f"hydra.launcher.jobs_per_gpu={self.jobs_per_gpu}: {at_once} jobs x "
                f"{largest.total_bytes / GIB:.1f} GiB ({largest.describe()}) = "
                f"{need / GIB:.1f} GiB > {free[device] / GIB:.1f} GiB {where} on {device}: "
                f"{fit}; lower hydra.launcher.jobs_per_gpu, or the batch")
        log.info("gpu_pack: %d jobs x %.1f GiB = %.1f GiB of %.1f GiB %s on %s", at_once,
                 largest.total_bytes / GIB, need / GIB, free[device] / GIB, where, device)

    def launch(self, job_overrides: Sequence[Sequence[str]],
               initial_job_idx: int) -> Sequence[JobReturn]:
        from bertkit.errors import BertkitError

        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        devices = self.devices()
        self.check_memory(job_overrides, devices)
        slots = make_slots(devices, self.jobs_per_gpu, launcher_cores())
        log.info("gpu_pack: %d jobs, %d at once (%d per device on %s), %d core(s) each; "
                 "sweep output dir: %s", len(job_overrides), len(slots), self.jobs_per_gpu,
                 ", ".join(device for device, _ in devices), len(slots[0].cores), sweep_dir)
        singleton_state = Singleton.get_state()
        pending = list(enumerate(job_overrides))
        free_slots = list(range(len(slots)))
        spares: dict = {}  # slot -> an executor whose fresh process is already importing
        running: dict = {}
        results: list = [None] * len(job_overrides)
        records: list = []
        crashed = []
        while pending or running:
            while pending and free_slots and not crashed:
                slot = free_slots.pop(0)
                index, overrides = pending.pop(0)
                log.info("\t#%d on %s: %s", initial_job_idx + index, slots[slot].device,
                         " ".join(filter_overrides(overrides)))
                executor = spares.pop(slot, None) or process_for(slots[slot])
                future = executor.submit(
                    run_packed_job, initial_job_idx + index, overrides, self.hydra_context,
                    self.config, self.task_function, singleton_state, slots[slot])
                running[future] = (slot, executor, index)
                if len(pending) > len(spares):
                    # The slot's next process starts importing now, while this job runs:
                    # a fresh process per job without waiting for Python, torch and
                    # bertkit to load between jobs.
                    spares[slot] = process_for(slots[slot])
            if not running:
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                slot, executor, index = running.pop(future)
                try:
                    results[index], record = future.result()
                    records.append(record)
                except Exception as err:  # the job's process died (Hydra's run_job catches
                    # what the job raises): the running jobs finish, no new one starts
                    crashed.append(f"{' '.join(filter_overrides(job_overrides[index]))}: "
                                   f"{type(err).__name__}: {err}")
                executor.shutdown(wait=False)  # its one process ends with its one job
                free_slots = sorted([*free_slots, slot])
        for executor in spares.values():
            executor.shutdown(wait=True, kill_workers=True)
        self.record_launch(sweep_dir, slots, records)
        if crashed:
            raise BertkitError(f"hydra/launcher=gpu_pack: the process of job {crashed[0]} "
                               f"ended without a result ({len(crashed)} such job(s)); the "
                               f"jobs then running finished, the rest did not start")
        return results

    def record_launch(self, sweep_dir: Path, slots: list[Slot], records: list) -> None:
        """Append this launch (one per halving rung) to <sweep dir>/gpu_pack.json."""
        import json

        from bertkit.data.atomic_files import write_json_atomic
        from bertkit.secret_masking import mask_secrets

        path = sweep_dir / "gpu_pack.json"
        launches = json.loads(path.read_text())["launches"] if path.is_file() else []
        launches.append({"jobs_per_gpu": self.jobs_per_gpu, "slots": len(slots),
                         "jobs": sorted(records, key=lambda record: record["job"])})
        write_json_atomic(path, mask_secrets({"launches": launches}))
