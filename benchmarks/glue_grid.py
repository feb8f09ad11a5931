"""The bench_grid job: the paper's GLUE protocol grid (bench_grid.learning_rates x
bench_grid.seeds at trainer's batch and epochs) finetuned by several arms on one device, from the
same weights: `plain`, run_glue.py's Trainer one job after another (bench_parity's plain way, in
this process), and bertkit's arms, each one `bertkit -m recipe=glue sweep=paper_glue` multirun of
the same grid launched by its own launcher (bench_grid.launchers: `bertkit` one at a time,
`gpu_pack` several processes at once, `fused` the grid as model arrays). bench_grid.ways picks
the arms. docs/speed.md ("bench-grid") says what is held equal and what the figures mean. Writes
grid_bench.json and prints a table."""

from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path

import torch
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.utils import create_config_search_path
from hydra.core.hydra_config import HydraConfig
from hydra.core.object_type import ObjectType
from omegaconf import DictConfig, OmegaConf
from transformers import BertConfig, BertModel, PreTrainedTokenizerBase, set_seed

from benchmarks.command import main
from benchmarks.glue_parity import PADDINGS, metric_names, plain_trainer
from benchmarks.measure import PeakMemory, device_name, ratio, timed, utilisation
from benchmarks.report import markdown_head, markdown_row, optional, publish
from benchmarks.settings import check_settings
from benchmarks.side_by_side import release, remove_if_empty
from benchmarks.sweep_launchers import launch
from bertkit.config_paths import config_dir
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

# The arm in this process; every other arm is a bertkit multirun named in bench_grid.launchers.
PLAIN = "plain"
# The arms every other arm's wall time is divided by (their time / the arm's: a speed-up).
BASELINES = (PLAIN, "bertkit")
# How a launcher is chosen on the command line (each bench_grid.launchers entry holds one).
LAUNCHER_OVERRIDE = "hydra/launcher="
# The bertkit arms' sweep preset: the paper's GLUE protocol, its learning rates set by the
# command line to bench_grid.learning_rates (its job directories: <task>/bs32-lr5e-05-ep3/seed1).
SWEEP = "paper_glue"
# Keys the bench sets itself on the bertkit arms' command line, left out of the user's.
OWN_OVERRIDES = ("recipe=", "bench_grid.", "hydra.", "hydra/", "task=", "model=", "sweep=",
                 "overwrite=", "seed=", "cache_dir=", "trainer.learning_rate=",
                 "trainer.per_device_train_batch_size=", "trainer.num_train_epochs=",
                 # starting_weights' checkpoint, given to every arm
                 "model.name_or_path=", "model.tokenizer=")
PLAIN_DESCRIPTION = ("run_glue.py's Trainer (bench_parity's plain way: padding={padding}, "
                     "random batches, evaluation after training), the jobs one after another "
                     "in one process")
BERTKIT_DESCRIPTION = "bertkit -m recipe=glue sweep=paper_glue with its defaults, {launcher}"
PLAIN_MEMORY = "per job: {kind}"
# What a bertkit arm's per-job figure is: its metrics.json's, the peak of the process it ran in.
BERTKIT_MEMORY = ("per job (a fused array's member: per member): metrics.json's "
                  "train.throughput.peak_memory_gb, the peak of the job's process since it "
                  "started (torch.cuda.max_memory_allocated on a GPU, peak RSS on a CPU); jobs "
                  "that share a process share its peak: one after another under the basic "
                  "launcher, at once as the members of one fused array; under gpu_pack each "
                  "job has its own process, and the jobs at once add up")


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
    _check_ways(grid)
    return [(rate, seed) for rate in rates for seed in seeds]


def _launcher_name(overrides) -> str | None:
    """The launcher a bench_grid.launchers entry chooses (hydra/launcher=NAME), or None."""
    return next((o[len(LAUNCHER_OVERRIDE):] for o in overrides
                 if o.startswith(LAUNCHER_OVERRIDE)), None)


def available_launchers() -> list[str]:
    """The hydra/launcher options `bertkit` composes (Hydra's own, bertkit's conf/, plugins')."""
    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(config_dir()))
    return loader.get_group_options("hydra/launcher", ObjectType.CONFIG)


def _check_ways(grid: DictConfig) -> None:
    """bench_grid.ways: different arms, each plain or a bench_grid.launchers entry whose
    launcher this bertkit has (checked before any arm runs: no grid half measured)."""
    ways, launchers = list(grid.ways), grid.launchers
    known = [PLAIN, *launchers]
    if not ways or len(set(ways)) != len(ways) or set(ways) - set(known):
        raise BertkitError(f"bench_grid.ways={ways}: expected one or more different arms of "
                           f"{', '.join(known)}")
    arms = [way for way in ways if way != PLAIN]
    have = available_launchers() if arms else []
    for way in arms:
        name = _launcher_name(launchers[way])
        if name is None:
            raise BertkitError(f"bench_grid.launchers.{way}={list(launchers[way])}: expected "
                               f"a {LAUNCHER_OVERRIDE}<name> override among them")
        if name not in have:
            raise BertkitError(f"bench_grid.ways: the {way} arm launches {LAUNCHER_OVERRIDE}"
                               f"{name}, which this bertkit lacks (it has {', '.join(have)}); "
                               f"leave {way} out of bench_grid.ways")


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


def _job_overrides(grid: DictConfig, model: DictConfig, trainer: DictConfig,
                   cache_dir: str) -> list[str]:
    """A bertkit finetune of the bench's task, model, data and trainer settings: the user's
    overrides but the bench's own, the protocol's batch and epochs, bench_grid.job."""
    choices = HydraConfig.get().runtime.choices
    passed = [o for o in HydraConfig.get().overrides.task
              if not o.lstrip("+~").startswith(OWN_OVERRIDES)]
    return ["recipe=glue", f"task={choices['task']}", f"model={choices['model']}",
            f"model.name_or_path={model.name_or_path}",
            f"model.tokenizer={model.tokenizer}", *passed,
            f"trainer.per_device_train_batch_size={trainer.per_device_train_batch_size}",
            f"trainer.num_train_epochs={trainer.num_train_epochs}", *grid.job,
            # overwrite=true: the finetunes' directories are this benchmark's own, which a
            # relaunch of an unfinished benchmark measures again.
            f"cache_dir={cache_dir}", "overwrite=true"]


def _bertkit_command(grid: DictConfig, model: DictConfig, trainer: DictConfig,
                     cache_dir: str, sweep_dir: Path, launcher) -> list[str]:
    """`bertkit -m recipe=glue ... sweep=paper_glue` of the grid (_job_overrides' finetune at
    every learning rate and seed), launched by `launcher` (a bench_grid.launchers entry)."""
    job = _job_overrides(grid, model, trainer, cache_dir)
    return ["-m", *job, f"sweep={SWEEP}",
            "trainer.learning_rate=" + ",".join(str(float(r)) for r in grid.learning_rates),
            "seed=" + ",".join(str(int(s)) for s in grid.seeds),
            f"hydra.sweep.dir={sweep_dir}", *launcher]


def _warm_up(cfg: DictConfig, run_dir: Path) -> None:
    """One step of one job, before any bertkit arm: the tokenised data in cache_dir, so that no
    arm pays for filling it and every arm finds it as a user's next grid does."""
    job = _job_overrides(cfg.bench_grid, cfg.model, cfg.trainer, cfg.cache_dir)
    logger.info("bench_grid: a one-step job fills the caches (output in %s)",
                run_dir / "warmup.log")
    launch([*job, f"trainer.learning_rate={float(cfg.bench_grid.learning_rates[0])}",
            f"seed={int(cfg.bench_grid.seeds[0])}", "trainer.max_steps=1",
            f"hydra.run.dir={run_dir / 'warmup'}"], run_dir / "warmup.log", job="bench_grid")


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


def _bertkit_grid(way: str, command: list[str], jobs: list[tuple[float, int]],
                  run_dir: Path) -> dict:
    """`command` (_bertkit_command's, writing its jobs under run_dir/<way>), launched; each
    job's figures read from the metrics.json it left, as bertkit-report reads them."""
    sweep_dir = run_dir / way
    log = run_dir / f"{way}.log"
    logger.info("bench_grid %s: bertkit %s (output in %s)", way, " ".join(command), log)
    seconds = launch(command, log, job="bench_grid")
    results = {}
    for path in sorted(sweep_dir.rglob(METRICS_FILE)):
        job = _bertkit_job(read_json(path))
        job["run_dir"] = path.parent.relative_to(run_dir).as_posix()
        name = _job_name(job["learning_rate"], job["seed"])
        if name in results:
            raise BertkitError(f"bench_grid: the {way} grid left two metrics.json for {name}: "
                               f"{results[name]['run_dir']} and {job['run_dir']}")
        results[name] = job
    missing = [_job_name(*job) for job in jobs if _job_name(*job) not in results]
    if missing:
        raise BertkitError(f"bench_grid: the {way} grid finished no metrics.json for "
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
        raise BertkitError("bench_grid: run on one process (the plain arm's jobs run in it, and "
                           "the bertkit arms' launchers place their own)")
    precision = {"bf16": probe.bf16, "fp16": probe.fp16}
    names = [_job_name(*job) for job in jobs]
    grid = cfg.bench_grid
    padding = f"{grid.baseline_padding}" + (f" {grid.baseline_max_length}"
                                             if grid.baseline_padding == "max_length" else "")
    # bertkit's arms first, one after another, after a warm-up: this process has not touched
    # the GPU yet, so the whole device is each arm's.
    arms = [way for way in grid.ways if way != PLAIN]
    ways = {}
    if arms:
        _warm_up(cfg, run_dir)
    for way in arms:
        launcher = list(grid.launchers[way])
        command = _bertkit_command(grid, cfg.model, cfg.trainer, cfg.cache_dir, run_dir / way,
                                   launcher)
        ways[way] = {**_bertkit_grid(way, command, jobs, run_dir), "launcher": launcher,
                     "description": BERTKIT_DESCRIPTION.format(launcher=" ".join(launcher)),
                     "memory": BERTKIT_MEMORY}
    if PLAIN in grid.ways:
        plain = _PlainWay(cfg.task, cfg.model,
                          {rate: OmegaConf.merge(cfg, {"trainer": {"learning_rate": rate}}
                                                 ).trainer for rate, _ in jobs},
                          grid, OmegaConf.select(cfg, "throughput"))
        ways[PLAIN] = {**_plain_grid(plain, jobs, run_dir, splits, tokenizer, precision),
                       "description": PLAIN_DESCRIPTION.format(padding=padding),
                       "memory": PLAIN_MEMORY.format(kind=PeakMemory().kind)}
    ways = {way: ways[way] for way in grid.ways}  # in the order asked
    for way in ways.values():
        way.update(_way_summary(way, names),
                   speed_up={base: ratio(ways[base]["wall_seconds"], way["wall_seconds"])
                             for base in BASELINES if base in ways})
    device = device_name()
    main = cfg.task.main_metric.removeprefix("validation_")
    # The arm every other arm's scores are compared with: plain where it ran.
    reference = PLAIN if PLAIN in ways else next(iter(ways))
    result = {
        "recipe": cfg.recipe.name, "task": cfg.task.name, "main_metric": main,
        "model": {"name_or_path": cfg.model.name_or_path,
                  "preset": HydraConfig.get().runtime.choices["model"]},
        "device": device, "torch_threads": torch.get_num_threads(),
        "precision": "bf16" if probe.bf16 else "fp16" if probe.fp16 else "fp32",
        "speed_claim": device != "cpu",
        "note": None if device != "cpu" else
        "on a CPU with a tiny model the ratios say what each arm saves of a step's fixed costs "
        "(Python, Trainer's hooks, kernel launches) and of its jobs' own (start, loads, "
        "evaluation) on this machine's cores; they make no GPU claim",
        "grid": {"learning_rates": [rate for rate, _ in jobs[::len(grid.seeds)]],
                 "seeds": [int(seed) for seed in grid.seeds],
                 "batch_size": int(cfg.trainer.per_device_train_batch_size),
                 "epochs": cfg.trainer.num_train_epochs,
                 # trainer.max_steps: a shorter grid (-1: the epochs' steps)
                 "max_steps": int(cfg.trainer.max_steps), "jobs": len(jobs),
                 "ways": list(ways)},
        "timing": "wall time of the whole grid: the plain arm's jobs in this process (model "
                  "loads, tokenisation, training, evaluation; no Python start), each bertkit "
                  "arm's `bertkit -m` command in its own process (Python's start and Hydra "
                  "included), after a one-step job filled the caches; speed_up: a baseline "
                  "arm's wall time over the arm's",
        "ways": ways,
        "reference": reference,
        "jobs": [{"job": name, "learning_rate": rate, "seed": seed,
                  "validation": {way: ways[way]["jobs"][name]["validation"] for way in ways},
                  "difference": {way: ways[way]["jobs"][name]["validation"][main]
                                 - ways[reference]["jobs"][name]["validation"][main]
                                 for way in ways if way != reference}}
                 for name, (rate, seed) in zip(names, jobs, strict=True)],
    }
    publish(result, run_dir / RESULT_FILE, _table)
    return result


def _table(result: dict, path: Path) -> str:
    grid, ways = result["grid"], result["ways"]
    reference = result["reference"]
    metrics = list(result["jobs"][0]["validation"][reference])
    baselines = [base for base in BASELINES if base in ways]
    lines = [
        f"\nbench_grid {result['task']}: {grid['jobs']} finetunes an arm (learning rates "
        f"{', '.join(f'{r:g}' for r in grid['learning_rates'])} x seeds "
        f"{', '.join(map(str, grid['seeds']))}, batch {grid['batch_size']}, {grid['epochs']} "
        f"epochs" + (f", at most {grid['max_steps']} steps" if grid["max_steps"] > 0 else "")
        + f"), {result['model']['preset']}, {result['device']} {result['precision']}",
        *markdown_head("arm", "launched", "grid wall time",
                       *(f"speed-up over {base}" for base in baselines),
                       "largest peak memory a job", "grid MFU"),
    ]
    for name, way in ways.items():
        lines.append(markdown_row(name, " ".join(way.get("launcher", ["in this process"])),
                          f"{way['wall_seconds']:.1f} s",
                          *(f"{optional(way['speed_up'][base], '.2f')}x" for base in baselines),
                          f"{optional(way['peak_memory_gb'], '.2f')} GiB",
                          optional(way["grid_mfu"], ".1%")))
    lines += ["", *markdown_head("job", *(f"{way} {m}" for m in metrics for way in ways),
                                 *(f"{way} memory" for way in ways))]
    for job in result["jobs"]:
        lines.append(markdown_row(
            job["job"], *(f"{job['validation'][way][m]:.4f}" for m in metrics for way in ways),
            *(f"{optional(ways[way]['jobs'][job['job']]['peak_memory_gb'], '.2f')} GiB"
              for way in ways)))
    for way in ways:
        if way != reference:
            largest = max(abs(job["difference"][way]) for job in result["jobs"])
            lines.append(f"largest {result['main_metric']} difference {way} - {reference}: "
                         f"{largest:.4f}")
    if result["note"]:
        lines.append(f"note: {result['note']}")
    lines.append(f"result: {path}")
    return "\n".join(lines)


# What `python -m benchmarks.glue_grid` runs: its job on its primary config,
# benchmarks/conf/bench_grid.yaml.
CONFIG = "bench_grid"
JOB = Job("benchmarks.glue_grid:benchmark_glue_grid", RESULT_FILE)

if __name__ == "__main__":
    main(JOB, CONFIG)
