"""Weights & Biases runs: the resolved config, the paper's hyperparameters under plain names,
grouping and tags for dashboards (a multirun's: wandb_sweep), offline when there are no
credentials.

Trainer's own WandbCallback logs the training curves into the run opened here.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from transformers import PreTrainedModel, TrainingArguments

from bertkit.errors import BertkitError
from bertkit.secret_masking import mask_secrets, masked_argv
from bertkit.training.models import count_parameters
from bertkit.training.wandb_sweep import SWEEP_TAG_PREFIX, later_job_of_multirun
from bertkit.wandb_credentials import has_wandb_credentials

logger = logging.getLogger(__name__)

MODES = ("auto", "online", "offline", "disabled")


def resolve_wandb_mode(setting: str) -> str:
    """WANDB_MODE in the environment wins, as W&B users expect; auto goes offline without a key."""
    if setting not in MODES:
        raise BertkitError(f"logger.mode={setting!r}: expected one of {', '.join(MODES)}")
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if setting == "auto":
        return "online" if has_wandb_credentials() else "offline"
    return setting


def paper_hyperparameters(
    args: TrainingArguments, model: PreTrainedModel, max_seq_length: int
) -> dict:
    """The knobs of Devlin et al. (2019) by plain names, so every run shows them side by side."""
    return {
        "learning_rate": args.learning_rate,
        "lr_scheduler_type": str(args.lr_scheduler_type.value
                                 if hasattr(args.lr_scheduler_type, "value")
                                 else args.lr_scheduler_type),
        # Trainer reads a warmup_steps below 1 as a share of all steps.
        "warmup_ratio": args.warmup_steps if args.warmup_steps < 1 else None,
        "warmup_steps": args.warmup_steps,
        "weight_decay": args.weight_decay,
        "adam_beta1": args.adam_beta1,
        "adam_beta2": args.adam_beta2,
        "adam_epsilon": args.adam_epsilon,
        "max_grad_norm": args.max_grad_norm,
        "hidden_dropout_prob": model.config.hidden_dropout_prob,
        "attention_probs_dropout_prob": model.config.attention_probs_dropout_prob,
        "hidden_act": model.config.hidden_act,
        "train_batch_size": args.per_device_train_batch_size * args.gradient_accumulation_steps
        * args.world_size,
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "num_train_epochs": args.num_train_epochs,
        "max_steps": args.max_steps,
        "max_seq_length": max_seq_length,
        "seed": args.seed,
        "num_parameters": count_parameters(model),
        "num_hidden_layers": model.config.num_hidden_layers,
        "hidden_size": model.config.hidden_size,
        "num_attention_heads": model.config.num_attention_heads,
    }


def start_wandb_run(cfg: DictConfig, run_dir: Path, hyperparameters: dict):
    """Open the run (main process only); returns it, or None when logging is off."""
    mode = resolve_wandb_mode(cfg.logger.mode)
    if cfg.logger.backend != "wandb" or mode == "disabled":
        return None
    import wandb

    # A sweep prints W&B's banner (version, where the run is saved, its closing summary and
    # sync lines) and the offline notice once, for its first job, not for every job.
    quiet = later_job_of_multirun()
    if mode == "offline" and not quiet:
        logger.warning("W&B: no credentials found (WANDB_API_KEY or `wandb login`): logging "
                       "offline under %s/wandb; upload later with `wandb sync`", run_dir)
    log = cfg.logger
    tags = [str(tag) for tag in log.tags]
    # A multirun's runs carry its id (its name and group say the configuration already); a
    # single run of a sweep preset its name, as a tag and a name prefix.
    sweep = log.get("sweep_id")
    name = log.name
    if sweep:
        tags.append(f"{SWEEP_TAG_PREFIX}{sweep}")
    elif log.sweep_tag:
        tags.append(f"{SWEEP_TAG_PREFIX}{log.sweep_tag}")
        name = f"{log.sweep_tag}-{name}"
    settings = mask_secrets({**hyperparameters,
                             "bertkit": OmegaConf.to_container(cfg, resolve=True)})
    with masked_argv():  # W&B records the command line in the run's metadata
        return wandb.init(
            project=log.project,
            entity=log.entity,
            group=log.group,
            job_type=cfg.recipe.name,
            tags=tags,
            name=name,
            dir=str(run_dir),
            mode=mode,
            config=settings,
            reinit="finish_previous",
            settings=wandb.Settings(silent=True) if quiet else None,
        )
