"""GLUE finetunes of a checkpoint right after pretraining, in the same job.

An ablation of pretraining (static vs dynamic masking, NSP or not) is judged downstream; run
as one job, each sweep point carries its own downstream scores into metrics.json. The
finetunes are composed from the same config tree as `bertkit recipe=glue`, so they use that
recipe's defaults plus the overrides given here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from bertkit.config_tree import compose_config, debug_overrides
from bertkit.data.metrics_file import LIMITED_SAMPLES, limited_samples
from bertkit.errors import BertkitError
from bertkit.tasks import task_family
from bertkit.training.finetune import finetune
from bertkit.training.models import check_model_settings


@dataclass(frozen=True)
class DownstreamSettings:
    """What the downstream finetunes read of the pretraining job's config, taken once at its
    entry (downstream_settings): the downstream node (None: the config has none), and the keys
    each finetune inherits."""

    downstream: DictConfig | None
    model: DictConfig | None
    logger_backend: str | None
    seed: int | None
    cache_dir: str | None
    debug_preset: str | None
    keep_checkpoints: bool = False


def downstream_settings(cfg: DictConfig) -> DownstreamSettings:
    """The job's DownstreamSettings, from its config."""
    return DownstreamSettings(
        OmegaConf.select(cfg, "downstream"), OmegaConf.select(cfg, "model"),
        OmegaConf.select(cfg, "logger.backend"), OmegaConf.select(cfg, "seed"),
        OmegaConf.select(cfg, "cache_dir"), OmegaConf.select(cfg, "debug.preset"),
        OmegaConf.select(cfg, "keep_checkpoints", default=False) is True)


def downstream_configs(settings: DownstreamSettings, model_dir: Path) -> dict[str, DictConfig]:
    """One GLUE config per task of downstream.tasks ({task: [overrides]})."""
    configs = {}
    shared = [str(o) for o in settings.downstream.overrides]
    logger = "wandb" if settings.logger_backend == "wandb" else "none"
    for task, overrides in settings.downstream.tasks.items():
        try:
            configs[task] = compose_config([
                "recipe=glue", f"task={task}", f"model.name_or_path={model_dir}",
                f"seed={settings.seed}", f"logger={logger}",
                f"cache_dir={settings.cache_dir}",
                f"keep_checkpoints={str(settings.keep_checkpoints).lower()}",
                *debug_overrides(settings.debug_preset), *shared,
                *[str(o) for o in overrides or []]])
        except Exception as err:  # Hydra's composition errors: name the key they came from
            raise BertkitError(f"downstream.tasks.{task}: {err}") from None
    return configs


def check_downstream(settings: DownstreamSettings) -> None:
    """The pretrained model's sizes against each downstream task, before pretraining starts
    (a task longer than its positions, or of sentence pairs on one token type, would fail
    only once the pretraining's hours are spent)."""
    if settings.downstream is None or not settings.downstream.get("tasks"):
        return
    for task, task_cfg in downstream_configs(settings, Path("pretrained-model")).items():
        at = f"downstream.tasks.{task}'s"
        segment = task_family(task_cfg.task.family).second_segment(task_cfg.task,
                                                                    task_cfg.data_source)
        check_model_settings(settings.model, {f"{at} task.max_seq_length":
                                         task_cfg.task.max_seq_length},
                             f"{at} {segment}" if segment else None, None)


def finetune_downstream(settings: DownstreamSettings, model_dir: Path,
                        run_dir: Path) -> dict[str, dict]:
    """{task: {main_metric, main_value, validation, limited_samples when its data was cut}}
    for every downstream task, each run
    through the finetune job like any `bertkit recipe=glue` run."""
    results = {}
    for task, task_cfg in downstream_configs(settings, model_dir).items():
        summary = finetune(task_cfg, task_family(task_cfg.task.family),
                           run_dir / "downstream" / task)
        results[task] = {key: summary[key] for key in ("main_metric", "main_value",
                                                       "validation")}
        if limited_samples(summary):  # a finetune on part of the data is no result on it
            results[task][LIMITED_SAMPLES] = limited_samples(summary)
    return results
