"""GLUE finetunes of a checkpoint right after pretraining, in the same job.

An ablation of pretraining (static vs dynamic masking, NSP or not) is judged downstream; run
as one job, each sweep point carries its own downstream scores into metrics.json. The
finetunes are composed from the same config tree as `bertkit recipe=glue`, so they use that
recipe's defaults plus the overrides given here.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from bertkit.config_tree import compose_config, debug_overrides
from bertkit.data.limited_samples import LIMITED_SAMPLES, limited_samples
from bertkit.errors import BertkitError
from bertkit.tasks import task_family
from bertkit.training.finetune import finetune
from bertkit.training.models import check_model_settings


def downstream_configs(cfg: DictConfig, model_dir: Path) -> dict[str, DictConfig]:
    """One GLUE config per task of downstream.tasks ({task: [overrides]}), with the pretraining
    job's seed, logger, cache, checkpoints and debug preset."""
    configs = {}
    shared = [str(o) for o in cfg.downstream.overrides]
    logger = "wandb" if cfg.logger.backend == "wandb" else "none"
    for task, overrides in cfg.downstream.tasks.items():
        try:
            configs[task] = compose_config([
                "recipe=glue", f"task={task}", f"model.name_or_path={model_dir}",
                f"seed={cfg.seed}", f"logger={logger}", f"cache_dir={cfg.cache_dir}",
                f"keep_checkpoints={str(cfg.keep_checkpoints is True).lower()}",
                *debug_overrides(OmegaConf.select(cfg, "debug.preset")), *shared,
                *[str(o) for o in overrides or []]])
        except Exception as err:  # Hydra's composition errors: name the key they came from
            raise BertkitError(f"downstream.tasks.{task}: {err}") from None
    return configs


def check_downstream(cfg: DictConfig) -> None:
    """The pretrained model's sizes against each downstream task, before pretraining starts
    (a task longer than its positions, or of sentence pairs on one token type, would fail
    only once the pretraining's hours are spent)."""
    if not cfg.downstream.tasks:
        return
    for task, task_cfg in downstream_configs(cfg, Path("pretrained-model")).items():
        at = f"downstream.tasks.{task}'s"
        segment = task_family(task_cfg.task.family).second_segment(task_cfg.task,
                                                                    task_cfg.data_source)
        check_model_settings(cfg.model, {f"{at} task.max_seq_length":
                                         task_cfg.task.max_seq_length},
                             f"{at} {segment}" if segment else None, None)


def finetune_downstream(cfg: DictConfig, model_dir: Path,
                        run_dir: Path) -> dict[str, dict]:
    """{task: {main_metric, main_value, validation, limited_samples when its data was cut}}
    for every downstream task, each run
    through the finetune job like any `bertkit recipe=glue` run."""
    results = {}
    for task, task_cfg in downstream_configs(cfg, model_dir).items():
        summary = finetune(task_cfg, task_family(task_cfg.task.family),
                           run_dir / "downstream" / task)
        results[task] = {key: summary[key] for key in ("main_metric", "main_value",
                                                       "validation")}
        if limited_samples(summary):  # a finetune on part of the data is no result on it
            results[task][LIMITED_SAMPLES] = limited_samples(summary)
    return results
