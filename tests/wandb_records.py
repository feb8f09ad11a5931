"""Read back what a W&B offline run stored in its `.wandb` file: bertkit's own reader
(bertkit.reporting.wandb_log), waiting for the exit record because the tests read a run right
after wandb.finish(), which can return before the W&B service has flushed the log."""

from __future__ import annotations

from pathlib import Path

from bertkit.reporting.wandb_log import complete_records, raw_records
from bertkit.reporting.wandb_log import read_offline_run as _read_offline_run

__all__ = ["complete_records", "raw_records", "read_offline_run"]


def read_offline_run(run_dir: Path, timeout: float = 60.0) -> dict:
    """The run's config (after every update), its tags, group, name and final summary, once
    the log's exit record is there."""
    return _read_offline_run(run_dir, wait_for_exit=timeout)
