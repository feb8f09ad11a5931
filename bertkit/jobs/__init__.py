"""One function that runs any bertkit job from its composed config: what `bertkit` calls, and
what tests and notebooks call with a config of their own (the lightning-hydra-template's pure
`train(cfg)`).

recipe.job picks the job: finetune (the task family of task.family, through the one
finetune template; two_stage.py when finetuning.intermediate.task is set), pretrain, or a
benchmark. Sits above the families: nothing below imports it.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from bertkit.config_schema import check_ranges
from bertkit.errors import BertkitError
from bertkit.jobs.two_stage import finetune_two_stage, is_two_stage
from bertkit.tasks import task_family
from bertkit.training.finetune import finetune
from bertkit.training.models import check_local_files
from bertkit.training.run import hydra_run_dir

# recipe.job -> "module:function(cfg, run_dir)" of the jobs that are not finetunes.
JOBS = {
    "pretrain": "bertkit.pretraining.run:pretrain",
    "bench_glue": "bertkit.benchmarks.glue_padding:benchmark_glue_padding",
    "bench_parity": "bertkit.benchmarks.glue_parity:benchmark_glue_parity",
    "bench_pretrain_data": "bertkit.benchmarks.pretrain_data:benchmark_pretrain_data",
    "bench_pretrain": "bertkit.benchmarks.pretrain_throughput:benchmark_pretrain_throughput",
    "bench_pretrain_quality": "bertkit.benchmarks.pretrain_quality:benchmark_pretrain_quality",
    "bench_sweep": "bertkit.benchmarks.sweep_launchers:benchmark_sweep_launchers",
    "bench_step": "bertkit.benchmarks.step_cost:benchmark_step_cost",
}


def check_task_family(cfg: DictConfig) -> None:
    """recipe=glue with task=squad_v1 would train SQuAD with GLUE's settings: refused."""
    wanted = OmegaConf.select(cfg, "recipe.task_family")
    family = OmegaConf.select(cfg, "task.family")
    if wanted is not None and family != wanted:
        raise BertkitError(
            f"task={cfg.task.name} is a {family} task, but recipe={cfg.recipe.name} runs "
            f"{wanted} tasks: pick a task of conf/task/ with family {wanted}, or "
            f"recipe={family}")


def run_job(cfg: DictConfig, run_dir: Path | None = None) -> dict:
    """The job's result record (a finetune's is its metrics.json)."""
    job = cfg.recipe.job
    if job != "finetune" and job not in JOBS:
        raise BertkitError(f"recipe.job={job!r}: expected finetune, {', '.join(JOBS)}")
    check_task_family(cfg)  # first: another family's task leaves the recipe's ${task.*} unset
    check_ranges(cfg)  # the schema'd groups (bertkit.config_schema): types were checked already
    check_local_files(cfg.model, fetched_only=True)  # model=minilm_l6: make minilm
    if job == "finetune" and is_two_stage(cfg):
        return finetune_two_stage(cfg, run_dir or hydra_run_dir())
    if job == "finetune":
        return finetune(cfg, task_family(cfg.task.family), run_dir)
    module, function = JOBS[job].split(":")
    return getattr(importlib.import_module(module), function)(cfg, run_dir)
