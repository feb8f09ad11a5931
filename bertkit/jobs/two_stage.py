"""Two-stage finetuning (STILTs, Phang et al. 2018) in one command: the intermediate task of
finetuning.intermediate first, then the run's own task from that encoder with a new head. A job
made of two finetune jobs (bertkit.training.finetune), so it sits with the job dispatch, which
runs it for recipe.job=finetune when finetuning.intermediate.task is set.

    <run dir>/intermediate/   the first stage: a whole finetuning run (metrics.json, model/)
    <run dir>/intermediate/encoder/   its encoder alone (BertModel), where the second starts
    <run dir>/                the target task: metrics.json, model/ (details.intermediate)

The first stage is plain full finetuning with the run's trainer settings, plus
finetuning.intermediate.trainer; the run's finetuning methods apply to the second. Both W&B
runs share the target's group, tagged stage:intermediate and stage:target.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import torch
from huggingface_hub.constants import REPOCARD_NAME
from omegaconf import DictConfig, OmegaConf, open_dict
from transformers import AutoModel

from bertkit.config_tree import compose_config, debug_overrides
from bertkit.data.atomic_files import follow_umask
from bertkit.data.metrics_file import INTERMEDIATE_PREFIX, LIMITED_SAMPLES, limited_samples
from bertkit.errors import BertkitError
from bertkit.tasks import task_family
from bertkit.training.finetune import finetune
from bertkit.training.models import from_pretrained

INTERMEDIATE = INTERMEDIATE_PREFIX.rstrip("/")


def stage_configs(cfg: DictConfig, run_dir: Path) -> tuple[DictConfig, DictConfig]:
    """(the intermediate task's config, the target's config starting from its encoder)."""
    settings = cfg.finetuning.intermediate
    name = str(settings.task)
    try:
        # debug=smoke: the first task's examples cut as the run's (task.max_*_samples)
        defaults = compose_config([f"task={name}",
                                   *debug_overrides(OmegaConf.select(cfg, "debug.preset"))])
    except Exception as err:  # Hydra's MissingConfigException and friends
        raise BertkitError(f"finetuning.intermediate.task={name}: not a task of conf/task/ "
                           f"({str(err).splitlines()[0]})") from None
    group = OmegaConf.select(cfg, "logger.group")
    first = copy.deepcopy(cfg)
    second = copy.deepcopy(cfg)
    with open_dict(first), open_dict(second):
        first.task = defaults.task
        if settings.data_dir is not None:
            first.task.data_dir = settings.data_dir
        first.trainer = OmegaConf.merge(cfg.trainer, settings.trainer or {})
        first.finetuning = defaults.finetuning  # plain full finetuning
        for stage, label in ((first, INTERMEDIATE), (second, "target")):
            # The target's group, resolved before the task changes under it; the tags resolve
            # per stage (task:<its task>).
            stage.logger.group = group
            stage.logger.tags = [*OmegaConf.to_container(cfg.logger.tags), f"stage:{label}"]
        first.logger.name = f"{cfg.logger.name}-{INTERMEDIATE}-{name}"
        # The tokenizer stays the run's (model configs name it after the checkpoint, e.g.
        # tokenizer: ${.name_or_path}): resolved before the checkpoint changes under it.
        tokenizer = OmegaConf.select(cfg, "model.tokenizer")
        if tokenizer is not None:
            second.model.tokenizer = str(tokenizer)
        second.model.started_from = cfg.model.name_or_path or "from_scratch"
        second.model.name_or_path = str(run_dir / INTERMEDIATE / "encoder")
    return first, second


def export_encoder(model_dir: Path, encoder_dir: Path) -> None:
    """The first stage's BertModel without its task head: the second stage's checkpoint, so
    that its head is new even when both tasks have as many labels."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if not distributed or torch.distributed.get_rank() == 0:
        encoder = from_pretrained(AutoModel, str(model_dir), "first stage's model", "model",
                                  trust_remote_code=False)
        encoder.save_pretrained(str(encoder_dir))
        follow_umask(encoder_dir)
        card = model_dir / REPOCARD_NAME  # the first stage's card: the run that trained it
        if card.is_file():
            shutil.copyfile(card, encoder_dir / REPOCARD_NAME)
    if distributed:
        torch.distributed.barrier()


def finetune_two_stage(cfg: DictConfig, run_dir: Path) -> dict:
    """Both stages through the finetune job, each with its task's family; returns the target's
    metrics.json record (its details name the first)."""
    first, second = stage_configs(cfg, run_dir)
    stage_dir = run_dir / INTERMEDIATE
    record = finetune(first, task_family(first.task.family), stage_dir)
    export_encoder(stage_dir / "model", stage_dir / "encoder")
    summary = {"task": record["task"], "main_metric": record["main_metric"],
               "main_value": record["main_value"], "run_dir": str(stage_dir),
               "train": record["train"]}
    # The first stage's cut splits (debug=smoke) are the target's too: its score stands on them.
    first_cuts = {f"{INTERMEDIATE_PREFIX}{split}": entry
                  for split, entry in limited_samples(record).items()}
    return finetune(second, task_family(second.task.family), run_dir,
                    details={"intermediate": summary,
                             **({LIMITED_SAMPLES: first_cuts} if first_cuts else {})})
