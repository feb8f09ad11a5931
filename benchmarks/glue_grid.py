"""The bench_grid job: the paper's GLUE protocol grid (bench_grid.learning_rates x
bench_grid.seeds at trainer's batch and epochs) finetuned two ways on one device, from the same
weights: `plain`, run_glue.py's Trainer one job after another (bench_parity's plain way, in this
process), and `bertkit`, one `bertkit -m recipe=glue sweep=paper_glue` multirun of the same grid
launched by hydra/launcher=bench_grid.launcher (its own process). docs/speed.md ("bench-grid")
says what is held equal and what the figures mean. Writes grid_bench.json and prints a table."""

from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from transformers import BertConfig, BertModel, PreTrainedTokenizerBase, set_seed

from benchmarks.command import main
from benchmarks.glue_parity import PADDINGS, metric_names, plain_trainer
from benchmarks.measure import PeakMemory, device_name, ratio, timed, utilisation
from benchmarks.report import optional, publish
from benchmarks.settings import check_settings
from benchmarks.side_by_side import release, remove_if_empty
from benchmarks.sweep_launchers import launch
from bertkit.data.atomic_files import read_json
from bertkit.data.metrics_file import METRICS_FILE
from bertkit.errors import BertkitError
from bertkit.jobs import Job
from bertkit.tasks.glue.family import FAMILY as GLUE
from bertkit.training.models import load_tokenizer
from bertkit.training.run import build_training_arguments, hydra_run_dir
from bertkit.training.throughput import GIB, add_throughput

RESULT_FILE = "grid_bench.json"  # written last (JOB names it)

logger = logging.getLogger(__name__)

WAYS = ("plain", "bertkit")
# Hydra's own launcher: one job after another, and no jobs_per_gpu setting to pass it.
SEQUENTIAL_LAUNCHER = "basic"
# The bertkit way's sweep preset: the paper's GLUE protocol, its learning rates set by the
# command line to bench_grid.learning_rates (its job directories: <task>/bs32-lr5e-05-ep3/seed1).
SWEEP = "paper_glue"
# Keys the bench sets itself on the bertkit way's command line, left out of the user's.
OWN_OVERRIDES = ("recipe=", "bench_grid.", "hydra.", "hydra/", "task=", "model=", "sweep=",
                 "overwrite=", "seed=", "cache_dir=", "trainer.learning_rate=",
                 "trainer.per_device_train_batch_size=", "trainer.num_train_epochs=",
                 # starting_weights' checkpoint, given to both ways
                 "model.name_or_path=", "model.tokenizer=")
DESCRIPTIONS = {
    "plain": "run_glue.py's Trainer (bench_parity's plain way: padding={padding}, random "
             "batches, evaluation after training), the jobs one after another in one process",
    "bertkit": "bertkit -m recipe=glue sweep=paper_glue with its defaults, "
               "hydra/launcher={launcher}",
}
MEMORY = {"plain": "per job: {kind}",
          "bertkit": "per job: metrics.json's train.throughput.peak_memory_gb (the job's "
                     "process since it started: torch.cuda.max_memory_allocated on a GPU, peak "
                     "RSS on a CPU; jobs that share a process, as under the basic launcher, "
                     "share its peak)"}


def _check(grid: DictConfig, task: DictConfig) -> list[tuple[float, int]]:
    """The grid's jobs (learning rate, seed), or one message for a setting it cannot use."""
    rates = [float(rate) for rate in grid.learning_rates]
    seeds = [int(seed) for seed in grid.seeds]
    if not rates or len(set(rates)) != len(rates):
        raise BertkitError(f"bench_grid.learning_rates={rates}: give one or more different "
                           f"learning rates")
    if not seeds or len(set(seeds)) != len(seeds):
        raise BertkitError(f"bench_grid.seeds={seeds}: give one or more different seeds")
    if grid.baseline_padding not in PADDINGS:
        raise BertkitError(f"bench_grid.baseline_padding={grid.baseline_padding}: expected "
                           f"one of {', '.join(PADDINGS)}")
    if grid.baseline_padding == "max_length" and grid.baseline_max_length < task.max_seq_length:
        raise BertkitError(
            f"bench_grid.baseline_max_length={grid.baseline_max_length} is below "
            f"task.max_seq_length={task.max_seq_length}: both ways truncate at "
            f"task.max_seq_length, and the plain way pads every example to baseline_max_length")
    return [(rate, seed) for rate in rates for seed in seeds]


def _job_name(rate: float, seed: int) -> str:
    return f"lr{rate:g}-seed{seed}"


def starting_weights(cfg: DictConfig, run_dir: Path,
                     tokenizer: PreTrainedTokenizerBase) -> DictConfig:
    """cfg with the checkpoint both ways finetune: model.name_or_path, or for a model from
    scratch its random init (seed) written once into run_dir/initial_checkpoint, standing in
    for the pretrained checkpoint the protocol starts from."""
    if cfg.model.name_or_path:
        return cfg
    directory = run_dir / "initial_checkpoint"
    set_seed(int(cfg.seed))
    config = BertConfig(pad_token_id=tokenizer.pad_token_id,
                        **{"vocab_size": len(tokenizer),
                           **OmegaConf.to_container(cfg.model.config, resolve=True)})
    BertModel(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return OmegaConf.merge(cfg, {"model": {"name_or_path": str(directory),
                                           "tokenizer": str(directory)}})


def _throughput_figures(record: dict | None) -> dict:
    """MFU, FLOPs and the device's peak of a throughput meter's record (None where absent)."""
    record = record or {}
    peak = record.get("peak_tflops")
    return {"mfu": record.get("mfu"), "flops": record.get("flops"),
            "peak_flops": peak * 1e12 if peak else None}


@dataclasses.dataclass(frozen=True)
class _PlainWay:
    """What the plain way's jobs read of the config, taken once at the entry: the trainer
    node at each learning rate of the grid (merged at the config's root, where its
    interpolations resolve)."""

    task: DictConfig
    model: DictConfig
    trainers: dict[float, DictConfig]
    grid: DictConfig
    throughput: DictConfig | None


def _plain_job(way: _PlainWay, rate: float, seed: int, run_dir: Path, splits,
               tokenizer: PreTrainedTokenizerBase, precision: dict) -> dict:
    trainer = plain_trainer(way.task, way.model, way.trainers[rate], way.grid, seed, run_dir,
                            splits, tokenizer, **precision)
    meter = add_throughput(way.throughput, trainer)
    with PeakMemory() as memory:
        output = trainer.train()
        scores = trainer.evaluate()
    names = metric_names(way.task)
    result = {"learning_rate": rate, "seed": seed,
              "validation": {key[len("eval_"):]: float(value) for key, value in scores.items()
                             if key[len("eval_"):] in names},
              "train_seconds": float(output.metrics["train_runtime"]),
              "training_loss": float(output.training_loss), "steps": int(output.global_step),
              "peak_memory_gb": memory.peak / GIB,
              **_throughput_figures(meter.record if meter is not None else None)}
    del trainer
    release()
    return result


def _plain_grid(way: _PlainWay, jobs: list[tuple[float, int]], run_dir: Path, splits,
                tokenizer: PreTrainedTokenizerBase, precision: dict) -> dict:
    def every_job() -> dict:
        results = {}
        for rate, seed in jobs:
            name = _job_name(rate, seed)
            logger.info("bench_grid plain: %s", name)
            results[name] = _plain_job(way, rate, seed, run_dir / "plain", splits, tokenizer,
                                       precision)
        return results

    # No sync at the start: a user's grid starts CUDA inside its own clock too.
    results, seconds = timed(every_job, sync=False)
    remove_if_empty(run_dir / "plain" / "checkpoints")
    remove_if_empty(run_dir / "plain")
    return {"wall_seconds": seconds, "jobs": results}


def _bertkit_command(grid: DictConfig, model: DictConfig, trainer: DictConfig,
                     cache_dir: str, sweep_dir: Path) -> list[str]:
    """`bertkit -m recipe=glue ...` of the same grid, task, model, data and trainer settings:
    the user's overrides but the bench's own, then the grid."""
    choices = HydraConfig.get().runtime.choices
    passed = [o for o in HydraConfig.get().overrides.task
              if not o.lstrip("+~").startswith(OWN_OVERRIDES)]
    launcher = [f"hydra/launcher={grid.launcher}"]
    if grid.launcher != SEQUENTIAL_LAUNCHER:
        launcher.append(f"hydra.launcher.jobs_per_gpu={grid.jobs_per_gpu}")
    return ["-m", "recipe=glue", f"task={choices['task']}", f"model={choices['model']}",
            f"model.name_or_path={model.name_or_path}",
            f"model.tokenizer={model.tokenizer}", *passed, f"sweep={SWEEP}",
            f"trainer.per_device_train_batch_size={trainer.per_device_train_batch_size}",
            f"trainer.num_train_epochs={trainer.num_train_epochs}",
            "trainer.learning_rate=" + ",".join(str(float(r)) for r in grid.learning_rates),
            "seed=" + ",".join(str(int(s)) for s in grid.seeds), *grid.job,
            # overwrite=true: the finetunes' directories are this benchmark's own, which a
            # relaunch of an unfinished benchmark measures again.
            f"cache_dir={cache_dir}", "overwrite=true", f"hydra.sweep.dir={sweep_dir}",
            *launcher]


def _bertkit_job(record: dict) -> dict:
    train = record["train"]
    throughput = train.get("throughput") or {}
    memory = throughput.get("peak_memory_gb")
    return {"learning_rate": float(record["hyperparameters"]["learning_rate"]),
            "seed": int(record["seed"]),
            "validation": {name: float(value) for name, value
                           in next(iter(record["validation"].values())).items()},
            "train_seconds": float(train["seconds"]), "training_loss": float(train["loss"]),
            "steps": int(train["steps"]),
            "peak_memory_gb": float(memory) if memory is not None else None,
            **_throughput_figures(throughput)}


def _bertkit_grid(command: list[str], jobs: list[tuple[float, int]], run_dir: Path) -> dict:
    """`command` (_bertkit_command's, writing its jobs under run_dir/bertkit), launched."""
    sweep_dir = run_dir / "bertkit"
    log = run_dir / "bertkit.log"
    logger.info("bench_grid bertkit: bertkit %s (output in %s)", " ".join(command), log)
    seconds = launch(command, log, job="bench_grid")
    results = {}
    for path in sorted(sweep_dir.rglob(METRICS_FILE)):
        job = _bertkit_job(read_json(path))
        job["run_dir"] = path.parent.relative_to(run_dir).as_posix()
        results[_job_name(job["learning_rate"], job["seed"])] = job
    missing = [_job_name(*job) for job in jobs if _job_name(*job) not in results]
    if missing:
        raise BertkitError(f"bench_grid: the bertkit grid finished no metrics.json for "
                           f"{', '.join(missing)}; see {log} and {sweep_dir}")
    return {"wall_seconds": seconds, "command": ["bertkit", *command], "jobs": results}


def _way_summary(way: dict, jobs: list[str]) -> dict:
    """The grid's figures: wall time, the largest peak memory of its jobs, and the grid's MFU
    (every job's training FLOPs over the grid's wall time at the device's peak)."""
    figures = [way["jobs"][name] for name in jobs]
    flops = [job["flops"] for job in figures]
    peak = figures[0]["peak_flops"]
    memory = [job["peak_memory_gb"] for job in figures if job["peak_memory_gb"] is not None]
    return {"peak_memory_gb": max(memory) if memory else None,
            "grid_mfu": utilisation(math.fsum(flops) if all(flops) else None,
                                    way["wall_seconds"], peak)}


def benchmark_glue_grid(cfg: DictConfig, run_dir: Path | None = None) -> dict:
    check_settings(cfg)
    run_dir = Path(run_dir or hydra_run_dir())
    run_dir.mkdir(parents=True, exist_ok=True)
    jobs = _check(cfg.bench_grid, cfg.task)
    GLUE.generate_data(cfg.task)
    splits = GLUE.read(cfg.task, cfg.data_source)
    cfg = starting_weights(cfg, run_dir, load_tokenizer(cfg.model))
    tokenizer = load_tokenizer(cfg.model)
    # The precision bertkit resolves (mixed_precision=auto: bf16 on a GPU that has it), given
    # to the plain way too, as run_glue.py --bf16 / --fp16 would be.
    probe = build_training_arguments(cfg, run_dir, [])
    if probe.world_size > 1:
        raise BertkitError("bench_grid: run on one process (the plain way's jobs run in it, and "
                           "the bertkit way's launcher places its own)")
    precision = {"bf16": probe.bf16, "fp16": probe.fp16}
    names = [_job_name(*job) for job in jobs]
    # bertkit's grid first: this process has not touched the GPU yet, so the whole device is
    # the grid's.
    command = _bertkit_command(cfg.bench_grid, cfg.model, cfg.trainer, cfg.cache_dir,
                               run_dir / "bertkit")
    ways = {"bertkit": _bertkit_grid(command, jobs, run_dir)}
    plain = _PlainWay(cfg.task, cfg.model,
                      {rate: OmegaConf.merge(cfg, {"trainer": {"learning_rate": rate}}).trainer
                       for rate, _ in jobs},
                      cfg.bench_grid, OmegaConf.select(cfg, "throughput"))
    ways["plain"] = _plain_grid(plain, jobs, run_dir, splits, tokenizer, precision)
    grid = cfg.bench_grid
    padding = f"{grid.baseline_padding}" + (f" {grid.baseline_max_length}"
                                             if grid.baseline_padding == "max_length" else "")
    for name, way in ways.items():
        way.update(_way_summary(way, names),
                   description=DESCRIPTIONS[name].format(padding=padding,
                                                         launcher=grid.launcher),
                   memory=MEMORY[name].format(kind=PeakMemory().kind))
    device = device_name()
    main = cfg.task.main_metric.removeprefix("validation_")
    result = {
        "recipe": cfg.recipe.name, "task": cfg.task.name, "main_metric": main,
        "model": {"name_or_path": cfg.model.name_or_path,
                  "preset": HydraConfig.get().runtime.choices["model"]},
        "device": device, "torch_threads": torch.get_num_threads(),
        "precision": "bf16" if probe.bf16 else "fp16" if probe.fp16 else "fp32",
        "speed_claim": device != "cpu",
        "note": None if device != "cpu" else
        "on a CPU with a tiny model this proves the mechanism (both ways, every job, the "
        "metrics side by side); it makes no speed claim",
        "grid": {"learning_rates": [rate for rate, _ in jobs[::len(grid.seeds)]],
                 "seeds": [int(seed) for seed in grid.seeds],
                 "batch_size": int(cfg.trainer.per_device_train_batch_size),
                 "epochs": cfg.trainer.num_train_epochs,
                 # trainer.max_steps: a shorter grid (-1: the epochs' steps)
                 "max_steps": int(cfg.trainer.max_steps), "jobs": len(jobs),
                 "launcher": grid.launcher,
                 "jobs_per_gpu": int(grid.jobs_per_gpu)
                 if grid.launcher != SEQUENTIAL_LAUNCHER else 1},
        "timing": "wall time of the whole grid: the plain way's jobs in this process (model "
                  "loads, tokenisation, training, evaluation; no Python start), the bertkit "
                  "way's `bertkit -m` command in its own process (Python's start and Hydra "
                  "included); ratio plain/bertkit",
        "ways": ways,
        "jobs": [{"job": name, "learning_rate": rate, "seed": seed,
                  **{way: ways[way]["jobs"][name]["validation"] for way in WAYS},
                  "difference": ways["bertkit"]["jobs"][name]["validation"][main]
                  - ways["plain"]["jobs"][name]["validation"][main]}
                 for name, (rate, seed) in zip(names, jobs, strict=True)],
        "time_ratio": ratio(ways["plain"]["wall_seconds"], ways["bertkit"]["wall_seconds"]),
    }
    publish(result, run_dir / RESULT_FILE, _table)
    return result


def _table(result: dict, path: Path) -> str:
    grid, ways = result["grid"], result["ways"]
    metrics = list(result["jobs"][0]["plain"])
    lines = [
        f"\nbench_grid {result['task']}: {grid['jobs']} finetunes a way (learning rates "
        f"{', '.join(f'{r:g}' for r in grid['learning_rates'])} x seeds "
        f"{', '.join(map(str, grid['seeds']))}, batch {grid['batch_size']}, {grid['epochs']} "
        f"epochs" + (f", at most {grid['max_steps']} steps" if grid["max_steps"] > 0 else "")
        + f"), {result['model']['preset']}, {result['device']} {result['precision']}, "
        f"bertkit launched with hydra/launcher={grid['launcher']}"
        + (f" ({grid['jobs_per_gpu']} jobs a device)" if grid["jobs_per_gpu"] > 1 else ""),
        f"  {'job':<18}" + "".join(f" {f'{way} {m}':>16}" for m in metrics for way in WAYS)
        + "".join(f" {f'{way} memory':>15}" for way in WAYS)
        + "".join(f" {f'{way} MFU':>12}" for way in WAYS),
    ]
    for job in result["jobs"]:
        figures = {way: ways[way]["jobs"][job["job"]] for way in WAYS}
        lines.append(
            f"  {job['job']:<18}"
            + "".join(f" {job[way][m]:>16.4f}" for m in metrics for way in WAYS)
            + "".join(f" {optional(figures[way]['peak_memory_gb'], '.2f') + ' GiB':>15}"
                      for way in WAYS)
            + "".join(f" {optional(figures[way]['mfu'], '.1%'):>12}" for way in WAYS))
    for way in WAYS:
        lines.append(f"  {way}: grid wall time {ways[way]['wall_seconds']:.1f} s, grid MFU "
                     f"{optional(ways[way]['grid_mfu'], '.1%')}, largest peak memory "
                     f"{optional(ways[way]['peak_memory_gb'], '.2f')} GiB")
    largest = max(abs(job["difference"]) for job in result["jobs"])
    lines += [f"  largest {result['main_metric']} difference bertkit - plain: {largest:.4f}",
              f"  grid wall time plain/bertkit: {optional(result['time_ratio'], '.2f')}x"]
    if result["note"]:
        lines.append(f"  note: {result['note']}")
    lines.append(f"  result: {path}")
    return "\n".join(lines)


# What `python -m benchmarks.glue_grid` runs: its job on its primary config,
# benchmarks/conf/bench_grid.yaml.
CONFIG = "bench_grid"
JOB = Job("benchmarks.glue_grid:benchmark_glue_grid", RESULT_FILE)

if __name__ == "__main__":
    main(JOB, CONFIG)
