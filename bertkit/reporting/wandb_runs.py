"""Finetuning results rebuilt from W&B run logs, for bertkit-report when run directories (their
metrics.json) are gone but the W&B offline run directories are still there.

What bertkit's runs put into W&B (wandb_logging.start_wandb_run, run.finish_wandb):
config = the paper's hyperparameters under plain names (learning_rate, train_batch_size,
num_train_epochs, seed, ...) plus "bertkit", the whole resolved config (recipe.name,
recipe.job, task.name, task.family, model.name_or_path); summary = final/<split>/<metric> for
every score of the final evaluation, main_metric, main_value, train/complete,
train/planned_steps, and Trainer's train/global_step. From these a RunResult equal to the one
read from the run's metrics.json is built (except run_dir, the W&B run directory, and source).

Logs of older runs are read too: their config has recipe.family (glue, squad, swag, ner,
pretrain) instead of recipe.job and task.family, and SQuAD's summary has a flat
final/<metric>, read as the split "validation".

One job directory holds one result, as it holds one metrics.json: of several W&B runs there
(an interrupted run and its resumption, a rerun), the latest finished one; when none
finished, the latest one, as a failed job. A finished run is one with an exit record of code
0 and a numeric main_value; a log without an exit record is a job still running or killed.
A run of another job (pretraining, a benchmark) is no finetuning result, and, as with its
metrics.json, nothing under its job directory (the downstream/ finetunes) is read either.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from bertkit.errors import BertkitError
from bertkit.reporting.identity import flatten, run_settings
from bertkit.reporting.results import GRID_KEYS, FailedRun, RunResult
from bertkit.reporting.wandb_log import read_offline_run

# recipe.job of a finetuning run; older runs had recipe.family, one of FINETUNE_FAMILIES.
FINETUNE_JOB = "finetune"
FINETUNE_FAMILIES = ("glue", "squad", "swag", "ner")
RUN_DIR_NAME = re.compile(r"^(offline-)?run-.+")
WANDB_SOURCE = "wandb"


def is_wandb_run_dir(path: Path, filenames: Iterable[str]) -> bool:
    """A W&B run directory: offline-run-<stamp>-<id> (offline) or run-<stamp>-<id> (a synced
    online run's local copy) holding its run-<id>.wandb log."""
    return bool(RUN_DIR_NAME.match(Path(path).name)) and any(
        name.startswith("run-") and name.endswith(".wandb") for name in filenames)


def job_dir(wandb_run_dir: Path) -> Path:
    """The run directory W&B was opened in: wandb.init(dir=D) writes D/wandb/<run dir>."""
    parent = Path(wandb_run_dir).parent
    return parent.parent if parent.name == "wandb" else parent


@dataclass(frozen=True)
class _Read:
    run_dir: Path
    start_time: float
    result: RunResult | FailedRun | None  # None: not a finetuning run of bertkit
    finetune: bool  # False for another job (pretraining, a benchmark): subtree skipped


def runs_from_wandb(run_dirs: Iterable[Path]) -> tuple[list[RunResult], list[FailedRun]]:
    """One result per job directory from the given W&B run directories (see the module doc)."""
    reads = [_read_or_failed(Path(d)) for d in run_dirs]
    others = {job_dir(r.run_dir) for r in reads if not r.finetune}
    by_job: dict[Path, list[_Read]] = {}
    for read in reads:
        job = job_dir(read.run_dir)
        if read.result is None or any(other in job.parents for other in others):
            continue
        by_job.setdefault(job, []).append(read)
    runs: list[RunResult] = []
    failed: list[FailedRun] = []
    for job in sorted(by_job):
        ordered = sorted(by_job[job], key=lambda r: (r.start_time, r.run_dir.name))
        finished = [r.result for r in ordered if isinstance(r.result, RunResult)]
        if finished:
            runs.append(finished[-1])
        else:
            failed.append(ordered[-1].result)
    return runs, failed


def _read_or_failed(run_dir: Path) -> _Read:
    """A log that cannot be read (damaged, or missing what a run records) is a failed run
    whose error names it, as a cut metrics.json is: the other runs are still reported."""
    try:
        return _read(run_dir)
    except BertkitError as err:
        return _Read(run_dir, -math.inf, FailedRun(run_dir, f"unreadable W&B log: {err}"), True)


def _read(run_dir: Path) -> _Read:
    log = read_offline_run(run_dir)
    start = log["start_time"] if log["start_time"] is not None else -math.inf
    path, config, summary = log["path"], log["config"], log["summary"]
    if not log["has_run_record"]:
        return _Read(run_dir, start, FailedRun(
            run_dir, "W&B log ends before the run's config was written: the job stopped as "
                     "it started"), True)
    bertkit = config.get("bertkit")
    if not isinstance(bertkit, dict):
        return _Read(run_dir, start, None, True)  # not a run of bertkit's
    if not is_finetune(bertkit, summary):
        return _Read(run_dir, start, None, False)
    seed = config.get("seed", select_dotted(bertkit, "seed"))
    what = f"{select_dotted(bertkit, 'task.name')} seed {seed}"
    exit_code = log["exit_code"]
    if exit_code is None:
        error = (f"unfinished ({what}): the W&B log has no exit record (the job is still "
                 f"running, or was killed)")
    elif exit_code != 0:
        error = f"failed ({what}): the W&B run exited with code {exit_code}"
    elif not _is_number(summary.get("main_value")):
        error = (f"failed ({what}): the W&B run ended without a main_value in its summary "
                 f"(the job stopped before its final evaluation)")
    else:
        return _Read(run_dir, start, _run_result(path, run_dir, config, bertkit, summary), True)
    return _Read(run_dir, start, FailedRun(run_dir, error), True)


def is_finetune(bertkit: dict, summary: dict) -> bool:
    """Whether a run of bertkit's is a finetuning job, finished or not. New runs say so in
    recipe.job; older ones had no job, only recipe.family, and a finetune of theirs that got
    as far as its final evaluation has a main_value whatever its family."""
    job = select_dotted(bertkit, "recipe.job")
    if job is not None:
        return job == FINETUNE_JOB
    return "main_value" in summary or select_dotted(bertkit, "recipe.family") in FINETUNE_FAMILIES


def _run_result(path: Path, run_dir: Path, config: dict, bertkit: dict,
                summary: dict) -> RunResult:
    for key in GRID_KEYS:
        if not _is_number(config.get(key)):
            raise BertkitError(f"{path}: W&B config {key} is missing or not a number")
    for key in ("task.name", "recipe.name"):
        if not isinstance(select_dotted(bertkit, key), str):
            raise BertkitError(f"{path}: W&B config bertkit.{key} is missing")
    seed = config.get("seed", select_dotted(bertkit, "seed"))
    if not _is_number(seed):
        raise BertkitError(f"{path}: W&B config seed is missing or not a number")
    if not isinstance(summary.get("main_metric"), str):
        raise BertkitError(f"{path}: W&B summary main_metric is missing")
    complete = summary.get("train/complete", True)
    if not isinstance(complete, bool):
        raise BertkitError(f"{path}: W&B summary train/complete {complete!r} is not true or "
                           f"false")
    return RunResult(
        run_dir=run_dir,
        recipe=select_dotted(bertkit, "recipe.name"),
        task=select_dotted(bertkit, "task.name"),
        model=str(select_dotted(bertkit, "model.name_or_path") or "from_scratch"),
        seed=int(seed),
        main_metric=summary["main_metric"],
        main_value=float(summary["main_value"]),
        grid_point=(float(config["learning_rate"]), int(config["train_batch_size"]),
                    float(config["num_train_epochs"])),
        metrics=final_scores(summary),
        steps=_number_or_none(summary.get("train/global_step")),
        planned_steps=_number_or_none(summary.get("train/planned_steps")),
        complete=complete,
        # Trainer's W&B callback logs the epoch reached as train/epoch.
        epochs_trained=(float(summary["train/epoch"]) if _is_number(summary.get("train/epoch"))
                        else None),
        source=WANDB_SOURCE,
        settings=run_settings(bertkit),
        settings_source="W&B config",
        config={**flatten(bertkit), **run_settings(bertkit)},
    )


def final_scores(summary: dict) -> dict[str, float]:
    """The summary's final/<split>/<metric> dev scores as {"split/metric": value}, the same
    keys as results.flatten_validation gives for metrics.json: a flat final/<metric> (older
    SQuAD runs) is the split "validation"; test splits (CoNLL-2003's test, scored with the
    dev set) are left out, as metrics.json keeps them in "test", out of "validation"."""
    scores = {}
    for key, value in summary.items():
        if not key.startswith("final/") or not _is_number(value):
            continue
        name = key.removeprefix("final/")
        split, _, metric = name.rpartition("/")
        split = split or "validation"
        if split.startswith("test"):
            continue
        scores[f"{split}/{metric}"] = float(value)
    return scores


def select_dotted(data: dict, dotted: str):
    """data["a"]["b"] for "a.b"; None where a part is missing."""
    for part in dotted.split("."):
        if not isinstance(data, dict):
            return None
        data = data.get(part)
    return data


def _is_number(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _number_or_none(value: object) -> int | None:
    return int(value) if _is_number(value) else None
