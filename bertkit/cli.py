"""The `bertkit` command: Hydra composes the config, the recipe's family runs it.

Bad input surfaces as a BertkitError and is printed as one line, not a traceback. In a
multirun (sweep) a failed job, whatever the error (bad input, out of memory, a diverging
setting), is recorded in its run directory as failed.json and the sweep goes on.
"""

from __future__ import annotations

import logging
import sys
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from bertkit.config_tree import config_dir
from bertkit.data.atomic_files import write_json_atomic
from bertkit.errors import BertkitError
from bertkit.training.distributed import run_stamp

logger = logging.getLogger("bertkit")


def sweep_stamp() -> str:
    """The name of the multirun's directory (its start time by default), the same for every
    job of one sweep: sweep presets put it in the W&B group so a dashboard shows one sweep's
    jobs together. Outside a multirun, the run's own stamp."""
    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        return Path(HydraConfig.get().sweep.dir).name
    return run_stamp()


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("bertkit_run_stamp"):
        OmegaConf.register_new_resolver("bertkit_run_stamp", run_stamp, use_cache=True)
    if not OmegaConf.has_resolver("bertkit_sweep_stamp"):
        OmegaConf.register_new_resolver("bertkit_sweep_stamp", sweep_stamp)


# The task family (task.family, "glue" when absent) each recipe family runs.
TASK_FAMILY_OF_RECIPE = {"glue": "glue", "bench_glue": "glue", "squad": "squad",
                         "swag": "swag", "ner": "ner"}


def check_task_family(cfg: DictConfig) -> None:
    wanted = TASK_FAMILY_OF_RECIPE.get(cfg.recipe.family)
    task_family = OmegaConf.select(cfg, "task.family", default="glue")
    if wanted is not None and task_family != wanted:
        raise BertkitError(
            f"task={cfg.task.name} is a {task_family} task, but recipe={cfg.recipe.name} runs "
            f"{wanted} tasks: pick a task of conf/task/ with family {wanted}, or "
            f"recipe={task_family}")


def run_recipe(cfg: DictConfig) -> dict:
    family = cfg.recipe.family
    check_task_family(cfg)
    if family == "glue":
        from bertkit.tasks.glue.family import finetune_glue

        return finetune_glue(cfg)
    if family == "squad":
        from bertkit.tasks.squad.family import finetune_squad

        return finetune_squad(cfg)
    if family == "swag":
        from bertkit.tasks.swag.family import finetune_swag

        return finetune_swag(cfg)
    if family == "ner":
        from bertkit.tasks.ner.family import finetune_ner

        return finetune_ner(cfg)
    if family == "pretrain":
        from bertkit.pretraining.run import pretrain

        return pretrain(cfg)
    if family == "bench_pretrain_data":
        from bertkit.benchmarks.pretrain_data import benchmark_pretrain_data

        return benchmark_pretrain_data(cfg)
    if family == "bench_glue":
        from bertkit.benchmarks.glue_padding import benchmark_glue_padding

        return benchmark_glue_padding(cfg)
    raise BertkitError(
        f"recipe.family={family!r}: no such task family (expected: glue, squad, "
        f"swag, ner, pretrain, bench_glue, bench_pretrain_data)")


def describe_failure(err: BaseException) -> str:
    """One line for failed.json and the report: bertkit's own message as it is, anything else
    prefixed with its type (torch.OutOfMemoryError, ValueError, ...)."""
    if isinstance(err, BertkitError):
        return str(err)
    return f"{type(err).__module__}.{type(err).__qualname__}: {err}".removeprefix("builtins.")


def record_failed_job(err: BaseException) -> None:
    """failed.json (the error, and the traceback unless it is bertkit's own message), the
    job's W&B run closed as failed, and GPU memory handed back for the next job."""
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    record = {"error": describe_failure(err), "job": hydra_cfg.job.num,
              "overrides": list(hydra_cfg.overrides.task)}
    if not isinstance(err, BertkitError):
        record["traceback"] = "".join(traceback.format_exception(err))
    write_json_atomic(run_dir / "failed.json", record)
    logger.error("job %s failed: %s", hydra_cfg.job.num, record["error"])
    if "wandb" in sys.modules:
        import wandb

        if wandb.run is not None:
            wandb.run.finish(exit_code=1)
    if "torch" in sys.modules:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _hydra_task(cfg: DictConfig) -> None:
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        run_recipe(cfg)
    except BertkitError as err:
        if multirun:
            record_failed_job(err)
            return
        print(f"bertkit: error: {err}", file=sys.stderr)
        sys.exit(2)
    except Exception as err:  # noqa: BLE001 - a sweep outlives any one job's failure
        if not multirun:
            raise
        record_failed_job(err)


def main() -> None:
    register_resolvers()
    hydra.main(config_path=config_dir(), config_name="config", version_base="1.3")(_hydra_task)()


if __name__ == "__main__":
    main()
