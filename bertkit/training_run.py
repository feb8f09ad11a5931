"""What every recipe family does around Trainer.train, in one place: the tracker Trainer
reports to, the W&B run and the resolved config.yaml on the main process, resuming from the
last checkpoint when asked, the training time, and closing the W&B run with the final scores.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from transformers import Trainer

from bertkit.experiment_logging import resolve_wandb_mode, start_wandb_run
from bertkit.run_outputs import write_text_atomic
from bertkit.training_setup import last_checkpoint

logger = logging.getLogger(__name__)


def report_to(cfg: DictConfig) -> list[str]:
    """Trainer's trackers: W&B unless logger=none or its mode is disabled."""
    mode = resolve_wandb_mode(cfg.logger.mode)
    return ["wandb"] if cfg.logger.backend == "wandb" and mode != "disabled" else []


@dataclass
class TrainingRun:
    main: bool  # this is the process that writes results
    wandb_run: Any  # the open W&B run (main process, W&B on), else None
    output: Any  # Trainer's TrainOutput
    seconds: float


def train(cfg: DictConfig, run_dir: Path, trainer: Trainer, hyperparameters: dict) -> TrainingRun:
    main = trainer.is_world_process_zero()
    uses_wandb = "wandb" in (trainer.args.report_to or [])
    wandb_run = start_wandb_run(cfg, run_dir, hyperparameters) if main and uses_wandb else None
    if main:
        write_text_atomic(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    checkpoint = last_checkpoint(trainer.args) if cfg.resume else None
    if cfg.resume and checkpoint is None:
        logger.warning("resume=true but %s holds no checkpoint: training from the start",
                       trainer.args.output_dir)
    started = time.perf_counter()
    output = trainer.train(resume_from_checkpoint=checkpoint)
    return TrainingRun(main, wandb_run, output, time.perf_counter() - started)


def finish_wandb(run: TrainingRun, final: dict[str, float], num_parameters: int) -> str:
    """The final scores into the run's summary as final/<key>, then close it; returns a line
    saying where the run went."""
    if run.wandb_run is None:
        return "W&B: off"
    for key, value in final.items():
        run.wandb_run.summary[f"final/{key}"] = value
    run.wandb_run.summary["num_parameters"] = num_parameters
    where = f"W&B run: {run.wandb_run.dir if run.wandb_run.offline else run.wandb_run.url}"
    run.wandb_run.finish()
    return where
