"""Find and read the finetuning results a run or a sweep left on disk, for bertkit-report.

A run directory is one that holds metrics.json (a finished run) or failed.json (a sweep job
that failed, see cli.py). The walk does not descend into a run directory, so the
downstream/<task>/metrics.json and checkpoints/ of a run are never read as runs of their own.
A malformed file stops the report with a BertkitError naming it: a table silently missing a
run would be worse than no table.

Where a run directory lost its metrics.json but kept its W&B run (wandb/offline-run-*/), the
result is rebuilt from the W&B log (wandb_runs.py); `source` picks which files count.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from bertkit.errors import BertkitError

METRICS_FILE = "metrics.json"
FAILED_FILE = "failed.json"
GRID_KEYS = ("learning_rate", "train_batch_size", "num_train_epochs")
# auto: metrics.json / failed.json where a run directory has them, else its W&B run log;
# files: metrics.json / failed.json only; wandb: the W&B run logs only.
SOURCES = ("auto", "files", "wandb")

GridPoint = tuple[float, int, float]


@dataclass(frozen=True)
class RunResult:
    """One finished finetuning run, as its metrics.json reports it."""

    run_dir: Path
    recipe: str
    task: str
    model: str
    seed: int
    main_metric: str
    main_value: float
    grid_point: GridPoint  # (learning_rate, train_batch_size, num_train_epochs)
    metrics: dict[str, float] = field(default_factory=dict)  # "split/metric" -> value
    # Successive halving stops runs part-way: steps trained of the planned schedule.
    steps: int | None = None
    planned_steps: int | None = None
    complete: bool = True
    source: str = METRICS_FILE  # or "wandb": rebuilt from the run's W&B log


@dataclass(frozen=True)
class FailedRun:
    """One sweep job that failed; error is the message of its failed.json."""

    run_dir: Path
    error: str


def collect_runs(root: Path, source: str = "files") -> tuple[list[RunResult], list[FailedRun]]:
    """All finetuning runs and failed jobs under root (itself a run directory or any parent).

    Both lists are sorted by run directory. A metrics.json without "main_metric" (a
    pretraining run) is not a finetuning result; the finetunes it ran downstream are
    (read_downstream_runs). When a directory holds both
    files, metrics.json wins: the job was rerun and finished.

    source (SOURCES): "files" reads metrics.json and failed.json only. "auto" also reads the
    W&B run directories (wandb/offline-run-*/run-*.wandb, or run-*/ of a synced online run)
    that are not inside a run directory with metrics.json or failed.json: those win, so no
    run is counted twice. "wandb" reads the W&B run logs only, wherever they are. A W&B log
    yields one result per job directory (see wandb_runs).
    """
    if source not in SOURCES:
        raise BertkitError(f"source {source!r}: expected one of {', '.join(SOURCES)}")
    root = Path(root)
    if not root.is_dir():
        raise BertkitError(f"{root}: no such directory")
    from bertkit.reporting.wandb_runs import is_wandb_run_dir, runs_from_wandb

    runs: list[RunResult] = []
    failed: list[FailedRun] = []
    wandb_dirs: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        here = Path(dirpath)
        if source != "wandb" and METRICS_FILE in filenames:
            dirnames.clear()  # downstream/, checkpoints/, model/ belong to this run
            run = read_run(here / METRICS_FILE)
            if run is not None:
                runs.append(run)
            else:
                runs += read_downstream_runs(here)
        elif source != "wandb" and FAILED_FILE in filenames:
            dirnames.clear()
            failed.append(read_failed(here / FAILED_FILE))
        elif source != "files" and is_wandb_run_dir(here, filenames):
            dirnames.clear()  # files/, logs/, tmp/
            wandb_dirs.append(here)
    if wandb_dirs:
        from_wandb, failed_wandb = runs_from_wandb(wandb_dirs)
        runs += from_wandb
        failed += failed_wandb
    runs.sort(key=lambda r: str(r.run_dir))
    failed.sort(key=lambda r: str(r.run_dir))
    return runs, failed


def read_downstream_runs(pretraining_dir: Path) -> list[RunResult]:
    """The finetunes a pretraining job ran on its own checkpoint (downstream/<task>/), each
    named after the pretraining arm, e.g. "pretrain_ablation (dynamic masking, mlm)", so
    that an ablation's arms are the rows of the table and its seeds are pooled per arm."""
    downstream = pretraining_dir / "downstream"
    if not downstream.is_dir():
        return []
    pretraining = _read_json_object(pretraining_dir / METRICS_FILE)
    arm = (f"{pretraining.get('recipe', 'pretraining')} ({pretraining.get('masking', '?')} "
           f"masking, {pretraining.get('objective', '?')})")
    model = f"pretrained on {pretraining.get('corpus', '?')}"
    runs = []
    for path in sorted(downstream.glob(f"*/{METRICS_FILE}")):
        run = read_run(path)
        if run is not None:
            runs.append(replace(run, recipe=arm, model=model))
    return runs


def read_run(path: Path) -> RunResult | None:
    """The RunResult of one metrics.json; None for a pretraining run (no "main_metric")."""
    data = _read_json_object(path)
    if "main_metric" not in data:
        return None
    for key in ("task", "seed", "main_value", "validation", "hyperparameters"):
        if key not in data:
            raise BertkitError(f"{path}: missing key {key!r}")
    hyper = data["hyperparameters"]
    if not isinstance(hyper, dict):
        raise BertkitError(f"{path}: 'hyperparameters' is not an object")
    for key in GRID_KEYS:
        if not _is_number(hyper.get(key)):
            raise BertkitError(f"{path}: hyperparameters.{key} is missing or not a number")
    if not _is_number(data["main_value"]):
        raise BertkitError(f"{path}: main_value {data['main_value']!r} is not a number")
    if not isinstance(data["validation"], dict):
        raise BertkitError(f"{path}: 'validation' is not an object")
    return RunResult(
        run_dir=path.parent,
        recipe=str(data.get("recipe", "")),
        task=str(data["task"]),
        model=str(data.get("model", "")),
        seed=int(data["seed"]),
        main_metric=str(data["main_metric"]),
        main_value=float(data["main_value"]),
        grid_point=(float(hyper["learning_rate"]), int(hyper["train_batch_size"]),
                    float(hyper["num_train_epochs"])),
        metrics=flatten_validation(data["validation"]),
        **_progress(path, data.get("train")),
    )


def _progress(path: Path, train: object) -> dict:
    """steps / planned_steps / complete of metrics.json's "train"; runs written before these
    keys existed count as complete."""
    if not isinstance(train, dict):
        return {}
    complete = train.get("complete", True)
    if not isinstance(complete, bool):
        raise BertkitError(f"{path}: train.complete {complete!r} is not true or false")
    return {"steps": train.get("steps") if _is_number(train.get("steps")) else None,
            "planned_steps": (train.get("planned_steps")
                              if _is_number(train.get("planned_steps")) else None),
            "complete": complete}


def read_failed(path: Path) -> FailedRun:
    data = _read_json_object(path)
    if not isinstance(data.get("error"), str):
        raise BertkitError(f"{path}: missing string key 'error'")
    return FailedRun(run_dir=path.parent, error=data["error"])


def flatten_validation(validation: dict) -> dict[str, float]:
    """{split: {metric: v}} -> {"split/metric": v}, keeping finite numbers only (None and
    strings are dropped). A flat {metric: v}, as SQuAD writes it, is read as the split
    "validation"."""
    flat: dict[str, float] = {}
    for key, value in validation.items():
        if isinstance(value, dict):
            for metric, number in value.items():
                if _is_number(number):
                    flat[f"{key}/{metric}"] = float(number)
        elif _is_number(value):
            flat[f"validation/{key}"] = float(value)
    return flat


def _read_json_object(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise BertkitError(f"{path}: cannot read: {err}") from None
    except json.JSONDecodeError as err:
        raise BertkitError(f"{path}: not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise BertkitError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def _is_number(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))
