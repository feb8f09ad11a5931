"""One function that runs any bertkit job from its composed config: what `bertkit` calls, and
what tests and notebooks call with a config of their own (the lightning-hydra-template's pure
`train(cfg)`).

recipe.job picks the job: finetune (the task family of task.family, through the one
finetune job; two_stage.py when finetuning.intermediate.task is set), pretrain, or a
benchmark. Sits above the families: nothing below imports it.

A directory that holds a finished run (the result file some job writes when it is done) is
never written into by a new job unless asked (check_finished_run): run_job makes the check
after the settings-only checks, before anything is read or written; bertkit.cli makes it
before Hydra writes too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from bertkit.config_schema import checked_once
from bertkit.data.metrics_file import METRICS_FILE
from bertkit.errors import BertkitError
from bertkit.jobs.two_stage import finetune_two_stage, is_two_stage
from bertkit.registry import imported
from bertkit.tasks import task_family
from bertkit.training.finetune import finetune
from bertkit.training.models import check_local_files
from bertkit.training.progress import apply_progress_bars
from bertkit.training.run import hydra_run_dir


@dataclass(frozen=True)
class Job:
    """A job of recipe.job, and how its run directory says it is finished."""

    entry: str | None  # "module:function(cfg, run_dir)"; None: finetune (run_job's own dispatch)
    result_file: str  # written when the job is done: its directory then holds a finished run
    resumes: bool = False  # resume=true continues a finished run from its newest checkpoint
    # Relaunched into its own finished run, it reuses what is done (seeds, arms) and adds what
    # is missing, so that relaunch is let through (recipes/recipe/bench_parity.yaml).
    reuses_its_runs: bool = False


# recipe.job -> the job.
JOBS = {
    "finetune": Job(None, METRICS_FILE, resumes=True),
    "pretrain": Job("bertkit.pretraining.run:pretrain", METRICS_FILE, resumes=True),
    "bench_glue": Job("bertkit.benchmarks.glue_padding:benchmark_glue_padding", "bench.json"),
    "bench_parity": Job("bertkit.benchmarks.glue_parity:benchmark_glue_parity", "parity.json",
                        reuses_its_runs=True),
    "bench_pretrain_data": Job("bertkit.benchmarks.pretrain_data:benchmark_pretrain_data",
                               "bench.json"),
    "bench_masking": Job("bertkit.benchmarks.masking_fidelity:benchmark_masking",
                         "masking.json"),
    "bench_pretrain": Job("bertkit.benchmarks.pretrain_throughput:benchmark_pretrain_throughput",
                          "bench_pretrain.json"),
    "bench_pretrain_quality": Job(
        "bertkit.benchmarks.pretrain_quality:benchmark_pretrain_quality",
        "bench_pretrain_quality.json", reuses_its_runs=True),
    "bench_sweep": Job("bertkit.benchmarks.sweep_launchers:benchmark_sweep_launchers",
                       "sweep_bench.json"),
    "bench_step": Job("bertkit.benchmarks.step_cost:benchmark_step_cost", "bench_step.json"),
    "bench_grid": Job("bertkit.benchmarks.glue_grid:benchmark_glue_grid", "grid_bench.json"),
}
RESULT_FILES = tuple(dict.fromkeys(job.result_file for job in JOBS.values()))


def finished_run(run_dir: Path) -> str | None:
    """The result file that makes run_dir a finished run (of any job), or None."""
    return next((name for name in RESULT_FILES if (Path(run_dir) / name).is_file()), None)


def check_finished_run(cfg: DictConfig, run_dir: Path) -> None:
    """Refuses to start a job in a directory that holds a finished run, unless overwrite=true,
    resume=true (a job that resumes) or the job is one that reuses its own runs; one line
    naming the run and the ways on. A run that stopped before its result file (preempted,
    failed, cut by train_fraction and set aside by successive halving) is not finished."""
    job = JOBS[cfg.recipe.job]
    found = finished_run(run_dir)
    if found is None or OmegaConf.select(cfg, "overwrite", default=False) is True:
        return
    if (job.resumes and OmegaConf.select(cfg, "resume") is True) or (
            job.reuses_its_runs and found == job.result_file):
        return
    sweep = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    ways = [f"{'hydra.sweep.dir' if sweep else 'hydra.run.dir'}=<another directory>",
            *(["resume=true to continue it from its newest checkpoint"] if job.resumes else []),
            "overwrite=true to write over it"]
    raise BertkitError(f"{run_dir} holds a finished run ({found}): give "
                       f"{', '.join(ways[:-1])}, or {ways[-1]}")


def check_task_family(recipe: DictConfig | None, task: DictConfig | None) -> None:
    """recipe=glue with task=squad_v1 would train SQuAD with GLUE's settings: refused (the
    recipe and task nodes; None where the config has none, as a pretraining config's task)."""
    wanted = None if recipe is None else OmegaConf.select(recipe, "task_family")
    family = None if task is None else OmegaConf.select(task, "family")
    if wanted is not None and family != wanted:
        raise BertkitError(
            f"task={task.name} is a {family} task, but recipe={recipe.name} runs "
            f"{wanted} tasks: pick a task of conf/task/ with family {wanted}, or "
            f"recipe={family}")


def run_job(cfg: DictConfig, run_dir: Path | None = None) -> dict:
    """The job's result record (a finetune's is its metrics.json)."""
    job = check_job(cfg.recipe, OmegaConf.select(cfg, "task"))
    # The schemas (bertkit.config_schema), once for the whole job: finetune and
    # check_pretraining_config do not check this config again.
    with checked_once(cfg):
        prepare_job(cfg, run_dir)
        if job == "finetune" and is_two_stage(cfg.finetuning):
            return finetune_two_stage(cfg, run_dir or hydra_run_dir())
        if job == "finetune":
            return finetune(cfg, task_family(cfg.task.family), run_dir)
        return imported(JOBS[job].entry)(cfg, run_dir)


def check_job(recipe: DictConfig, task: DictConfig | None) -> str:
    """recipe.job, known; the task of the recipe's family (first: another family's task leaves
    the recipe's ${task.*} unset, and the schema's check would stumble on it)."""
    if recipe.job not in JOBS:
        raise BertkitError(f"recipe.job={recipe.job!r}: expected {', '.join(JOBS)}")
    check_task_family(recipe, task)
    return recipe.job


def prepare_job(cfg: DictConfig, run_dir: Path | None) -> None:
    """Before anything is read or written (the checks before only read the settings): a
    finished run in run_dir refused, a fetched-only model present, the progress bars decided
    once for the job."""
    check_finished_run(cfg, Path(run_dir or hydra_run_dir()))
    check_local_files(cfg.model, fetched_only=True)  # model=minilm_l6: make minilm
    apply_progress_bars(cfg)  # bars on a terminal only (auto)
