"""Find every finetuning and pretraining result under an outputs directory, for bertkit-report.

A run directory is one that holds metrics.json (a finished run) or failed.json (a sweep job
that failed). The walk does not descend into a run directory, so the
downstream/<task>/metrics.json and checkpoints/ of a run are never read as runs of their own.
Where a run directory lost its metrics.json but kept its W&B run (wandb/offline-run-*/), the
result is rebuilt from the W&B log (wandb_runs.py); `source` picks which files count. Kept
apart from results.py and wandb_runs.py, the two readers it joins, so neither imports the
other.
"""

from __future__ import annotations

import os
from pathlib import Path

from bertkit.data.metrics_file import FAILED_FILE, METRICS_FILE
from bertkit.errors import BertkitError
from bertkit.reporting.results import (
    FailedRun,
    PretrainingRun,
    RunResult,
    read_downstream_runs,
    read_failed,
    read_pretraining_run,
    read_run,
)
from bertkit.reporting.wandb_runs import is_wandb_run_dir, runs_from_wandb

# auto: metrics.json / failed.json where a run directory has them, else its W&B run log;
# files: metrics.json / failed.json only; wandb: the W&B run logs only.
SOURCES = ("auto", "files", "wandb")


def collect_runs(root: Path, source: str = "files") -> tuple[list[RunResult], list[FailedRun]]:
    """All finetuning runs and failed jobs under root (collect, pretraining runs aside)."""
    runs, _, failed = collect(root, source)
    return runs, failed


def collect(root: Path, source: str = "files") -> tuple[list[RunResult], list[PretrainingRun],
                                                         list[FailedRun]]:
    """All finetuning runs, pretraining runs and failed jobs under root (itself a run
    directory or any parent).

    The lists are sorted by run directory. A metrics.json without "main_metric" is a
    pretraining run (read_pretraining_run); the finetunes it ran downstream are finetuning
    runs of their own (read_downstream_runs). When a directory holds both files, metrics.json
    wins: the job was rerun and finished. Hidden directories (.hydra, a set-aside
    .<name>.overwritten-* run) are not read.

    source (SOURCES): "files" reads metrics.json and failed.json only. "auto" also reads the
    W&B run directories (wandb/offline-run-*/run-*.wandb, or run-*/ of a synced online run)
    that are not inside a run directory with metrics.json or failed.json: those win, so no
    run is counted twice. "wandb" reads the W&B run logs only, wherever they are. A W&B log
    yields one result per job directory (see wandb_runs); it has no pretraining results.

    A run whose files cannot be read (metrics.json or config.yaml cut by a full disk, edited by
    hand) counts as a failed run whose error names the file: one bad file in a sweep of a
    hundred must not hide the other ninety-nine.
    """
    if source not in SOURCES:
        raise BertkitError(f"source {source!r}: expected one of {', '.join(SOURCES)}")
    root = Path(root)
    if not root.is_dir():
        raise BertkitError(f"{root}: no such directory")
    runs: list[RunResult] = []
    pretraining: list[PretrainingRun] = []
    failed: list[FailedRun] = []
    wandb_dirs: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        here = Path(dirpath)
        if source != "wandb" and METRICS_FILE in filenames:
            dirnames.clear()  # downstream/, checkpoints/, model/ belong to this run
            try:
                run = read_run(here / METRICS_FILE)
                if run is None:
                    runs += read_downstream_runs(here)
                    pretraining.append(read_pretraining_run(here / METRICS_FILE))
                else:
                    runs.append(run)
            except BertkitError as err:  # a cut or corrupt file: a failed run, named
                failed.append(FailedRun(here, f"unreadable result: {err}"))
        elif source != "wandb" and FAILED_FILE in filenames:
            dirnames.clear()
            try:
                failed.append(read_failed(here / FAILED_FILE))
            except BertkitError as err:
                failed.append(FailedRun(here, f"unreadable failure record: {err}"))
        elif source != "files" and is_wandb_run_dir(here, filenames):
            dirnames.clear()  # files/, logs/, tmp/
            wandb_dirs.append(here)
    if wandb_dirs:
        from_wandb, failed_wandb = runs_from_wandb(wandb_dirs)
        runs += from_wandb
        failed += failed_wandb
    for found in (runs, pretraining, failed):
        found.sort(key=lambda r: str(r.run_dir))
    return runs, pretraining, failed
