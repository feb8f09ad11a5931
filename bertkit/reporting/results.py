"""The finetuning results of one run directory, read from the files a run or a sweep job left:
metrics.json (a finished run) and failed.json (a sweep job that failed, see cli.py).

metrics.json is read through bertkit.data.metrics_file.upgrade, so a file of any schema is
read as schema 2 (dev scores always {split: {metric: value}}) and nothing here knows which
family wrote it. A malformed file is a BertkitError naming it, which collect.py turns into a
failed run of the report: named, never silently missing from a table. Finding the run
directories (and the W&B logs of runs whose metrics.json is gone) is collect.py's job; this
module imports nothing of it, so that wandb_runs.py can build the same RunResult.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from bertkit.data.atomic_files import read_json, read_yaml
from bertkit.data.metrics_file import INPUT_FINGERPRINTS, METRICS_FILE, SCHEMA_VERSION, upgrade
from bertkit.errors import BertkitError
from bertkit.reporting.identity import MODEL_KEY, PRETRAINING, flatten, run_settings

CONFIG_FILE = "config.yaml"  # the run's resolved config, beside its metrics.json

GRID_KEYS = ("learning_rate", "train_batch_size", "num_train_epochs")

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
    # The epochs really trained (metrics.json's train.epochs): fewer than the grid point's
    # num_train_epochs when max_steps or a stop ended the run first. None: not recorded.
    epochs_trained: float | None = None
    source: str = METRICS_FILE  # or "wandb": rebuilt from the run's W&B log
    # What can split the report's rows (identity.py): the resolved config's settings, or
    # metrics.json's hyperparameters for a run without config.yaml (settings_source says).
    settings: dict[str, object] = field(default_factory=dict)
    settings_source: str = CONFIG_FILE
    # Every setting of the run, flattened ("trainer.learning_rate": 2e-05), the seed and the
    # grid included, besides those of `settings`: what --compare's KEY=VALUE selections match.
    config: dict[str, object] = field(default_factory=dict)
    # metrics.json's details.limited_samples: {split: {"examples": N, "of": M}} of the splits
    # the run cut to their first examples (debug=smoke, task.max_eval_samples); {}: none.
    limited_samples: dict[str, dict] = field(default_factory=dict)

    @property
    def marks(self) -> tuple[str, ...]:
        """What sets the run apart from a full run of its settings (identity.RowSplit keeps
        it in rows of its own and names it)."""
        return partial_marks(self.limited_samples)


PRETRAINING_TASK = "pretraining"  # the task of a pretraining run: its rows are its own
# The held-out (or last training window's) scores a pretraining run reports, in the order
# of the table: (metric, higher is better). The sentence task's accuracy is whichever of NSP
# and SOP the objective has.
PRETRAINING_METRICS = (("mlm_loss", False), ("mlm_accuracy", True), ("nsp_accuracy", True),
                       ("sop_accuracy", True))
LAST_WINDOW = "no held-out set: scores of the last training window"


@dataclass(frozen=True)
class PretrainingRun:
    """One finished pretraining run: the held-out scores of its final checkpoint (or, for a
    run without a held-out set, of its last training window: `heldout` False, and its rows
    say so), the tokens it saw and its time. Its settings are keyed under PRETRAINING, as
    those of its downstream finetunes, so that an arm has one name in both tables."""

    run_dir: Path
    recipe: str
    corpus: str
    seed: int
    scores: dict[str, float]  # metric of PRETRAINING_METRICS -> value
    heldout: bool
    tokens_seen: float | None
    seconds: float | None
    settings: dict[str, object] = field(default_factory=dict)
    settings_source: str = CONFIG_FILE
    config: dict[str, object] = field(default_factory=dict)
    limited_samples: dict[str, dict] = field(default_factory=dict)
    source: str = METRICS_FILE
    task: str = PRETRAINING_TASK
    complete: bool = True

    @property
    def model(self) -> str:
        return f"pretrained on {self.corpus}"

    @property
    def marks(self) -> tuple[str, ...]:
        return partial_marks(self.limited_samples) + (() if self.heldout else (LAST_WINDOW,))


def partial_marks(limited: dict) -> tuple[str, ...]:
    """("partial: validation 16 of 277, train 16 of 2490",) for a run on the first examples
    of some splits; () for a run on all its data."""
    if not limited:
        return ()
    cut = ", ".join(cut_words(split, n) for split, n in sorted(limited.items()))
    return (f"partial: {cut}",)


def cut_words(split: str, cut: object) -> str:
    """validation 16 of 277; corpus first 16 (the whole not counted: "of" is null)."""
    if not isinstance(cut, dict):
        return str(split)
    if cut.get("of") is None:
        return f"{split} first {cut.get('examples', '?')}"
    return f"{split} {cut.get('examples', '?')} of {cut['of']}"


@dataclass(frozen=True)
class FailedRun:
    """One sweep job that failed; error is the message of its failed.json."""

    run_dir: Path
    error: str


def read_downstream_runs(pretraining_dir: Path) -> list[RunResult]:
    """The finetunes a pretraining job ran on its own checkpoint (downstream/<task>/), with
    the pretraining's settings under PRETRAINING: an ablation's arms are the rows of the
    table, named by the settings they differ in (masking=dynamic · objective=mlm), and its
    seeds are pooled per arm."""
    downstream = pretraining_dir / "downstream"
    if not downstream.is_dir():
        return []
    pretraining = read_json(pretraining_dir / METRICS_FILE)
    arm = str(pretraining.get("recipe", "pretraining"))
    model = f"pretrained on {pretraining.get('corpus', '?')}"
    # The checkpoint is this arm's: its own path (one per seed) and tokenizer say nothing
    # more; the pretraining's settings (seed aside) say which arm it is.
    pretrained = _config(pretraining_dir)
    arm_settings = (run_settings(pretrained, prefix=PRETRAINING,
                                 input_fingerprints=_input_fingerprints(pretraining))
                    if pretrained is not None else {f"{PRETRAINING}recipe.name": arm})
    runs = []
    for path in sorted(downstream.glob(f"*/{METRICS_FILE}")):
        run = read_run(path)
        if run is not None:
            settings = {k: v for k, v in run.settings.items()
                        if k not in (MODEL_KEY, "model.tokenizer")}
            settings = {**settings, MODEL_KEY: model, **arm_settings}
            arm_config = {f"{PRETRAINING}{k}": v for k, v in flatten(pretrained or {}).items()}
            # A checkpoint pretrained on part of its data marks its finetunes too.
            limited = {**run.limited_samples, **{f"pretraining {split}": cut for split, cut
                                                 in _limited_samples(pretraining).items()}}
            runs.append(replace(run, recipe=arm, model=model, settings=settings,
                                config={**run.config, **arm_config, **settings},
                                limited_samples=limited))
    return runs


def read_pretraining_run(path: Path) -> PretrainingRun:
    """The PretrainingRun of a pretraining metrics.json (no "main_metric")."""
    data = read_json(path)
    heldout = data.get("heldout")
    final = heldout.get("final") if isinstance(heldout, dict) else None
    window = final if isinstance(final, dict) else data.get("last_log")
    window = window if isinstance(window, dict) else {}  # no scores: its cells are empty
    scores = {m: float(window[m]) for m, _ in PRETRAINING_METRICS if _is_number(window.get(m))}
    train = data.get("train") if isinstance(data.get("train"), dict) else {}
    config, settings_source = _config(path.parent), CONFIG_FILE
    if config is None:  # what metrics.json records
        config = {**(data.get("hyperparameters") or {}),
                  **{k: data[k] for k in ("recipe", "corpus", "objective", "masking")
                     if k in data}}
        settings_source = METRICS_FILE
    settings = run_settings(config, prefix=PRETRAINING,
                            input_fingerprints=_input_fingerprints(data))
    seed = data.get("seed", config.get("seed"))
    if not _is_number(seed):
        raise BertkitError(f"{path}: no seed (metrics.json's 'seed' or config.yaml's)")
    return PretrainingRun(
        run_dir=path.parent, recipe=str(data.get("recipe", "")),
        corpus=str(data.get("corpus", "?")), seed=int(seed), scores=scores,
        heldout=isinstance(final, dict),
        tokens_seen=(float(train["tokens_seen"]) if _is_number(train.get("tokens_seen"))
                     else None),
        seconds=float(train["seconds"]) if _is_number(train.get("seconds")) else None,
        settings=settings, settings_source=settings_source,
        config={**{f"{PRETRAINING}{k}": v for k, v in flatten(config).items()}, **settings},
        limited_samples=_limited_samples(data),
        complete=train.get("complete", True) is not False)


def _limited_samples(data: dict) -> dict[str, dict]:
    # Read here, not through bertkit.data.metrics_file: that module imports datasets,
    # which bertkit-report does not need.
    details = data.get("details")
    found = details.get("limited_samples") if isinstance(details, dict) else None
    return dict(found) if isinstance(found, dict) else {}


def _config(run_dir: Path) -> dict | None:
    """The run's config.yaml as a mapping; None when the run has none (runs from before it
    was written, or a metrics.json copied alone)."""
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        return None
    return read_yaml(path)


def read_run(path: Path) -> RunResult | None:
    """The RunResult of one metrics.json; None for a pretraining run (no "main_metric")."""
    data = read_json(path)
    if "main_metric" not in data:
        return None
    data = _upgraded(path, data)
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
    config, settings_source = _config(path.parent), CONFIG_FILE
    if config is None:  # what metrics.json records: the hyperparameters, recipe and model
        config = {**hyper, "recipe": {"name": str(data.get("recipe", ""))},
                  "model": {"name_or_path": str(data.get("model", ""))}}
        settings_source = METRICS_FILE
    settings = run_settings(config, data_fingerprint=_data_fingerprint(data),
                            input_fingerprints=_input_fingerprints(data))
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
        settings=settings,
        settings_source=settings_source,
        config={**flatten(config), **settings},
        **_progress(path, data.get("train")),
        epochs_trained=_epochs_trained(data.get("train"), hyper),
        limited_samples=_limited_samples(data),
    )


def _data_fingerprint(data: dict) -> str | None:
    details = data.get("details")
    fingerprint = details.get("data_fingerprint") if isinstance(details, dict) else None
    return fingerprint if isinstance(fingerprint, str) else None


def _input_fingerprints(data: dict) -> dict[str, str]:
    """details.input_fingerprints: {config key: fingerprint} of the local checkpoint,
    tokenizer and corpus the run read (bertkit.data.cache); {} for a run from before."""
    details = data.get("details")
    found = details.get(INPUT_FINGERPRINTS) if isinstance(details, dict) else None
    return ({key: value for key, value in found.items()
             if isinstance(key, str) and isinstance(value, str)}
            if isinstance(found, dict) else {})


def _upgraded(path: Path, data: dict) -> dict:
    """The file as schema 2. A schema_version that is no whole number (upgrade compares it) is
    a damaged file; a higher one than this bertkit knows, a file it would misread: named."""
    version = data.get("schema_version", 1)
    if (not isinstance(version, int) or isinstance(version, bool)
            or not 1 <= version <= SCHEMA_VERSION):
        raise BertkitError(f"{path}: schema_version {version!r}: expected a whole number from "
                           f"1 to {SCHEMA_VERSION}")
    return upgrade(data)


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


def _epochs_trained(train: object, hyper: dict) -> float | None:
    """train.epochs. A record written before it was kept: on a schedule of epochs
    (max_steps <= 0), num_train_epochs times the share of the planned steps trained (early
    stopping ends it before); capped by max_steps, the steps over an epoch's steps (the
    training examples in batches of train_batch_size, as Trainer counts them). None where the
    record cannot tell (SQuAD and NER count windows and features, not examples)."""
    if not isinstance(train, dict):
        return None
    if _is_number(train.get("epochs")):
        return float(train["epochs"])
    steps, planned, epochs = train.get("steps"), train.get("planned_steps"), \
        hyper.get("num_train_epochs")
    if not all(_is_number(v) and v > 0 for v in (steps, epochs)):
        return None
    max_steps = hyper.get("max_steps")
    if not (_is_number(max_steps) and max_steps > 0):
        return epochs * steps / planned if _is_number(planned) and planned > 0 else None
    examples, batch = train.get("examples"), hyper.get("train_batch_size")
    if not all(_is_number(v) and v > 0 for v in (examples, batch)):
        return None
    return min(float(epochs), steps / math.ceil(examples / batch))


def read_failed(path: Path) -> FailedRun:
    data = read_json(path)
    if not isinstance(data.get("error"), str):
        raise BertkitError(f"{path}: missing string key 'error'")
    return FailedRun(run_dir=path.parent, error=data["error"])


def flatten_validation(validation: dict) -> dict[str, float]:
    """Schema 2's {split: {metric: v}} -> {"split/metric": v}, keeping finite numbers only
    (None and strings are dropped). Only dev splits come here: metrics.json keeps labelled
    test splits in "test", which the report never ranks."""
    flat: dict[str, float] = {}
    for split, scores in validation.items():
        if isinstance(scores, dict):
            for metric, number in scores.items():
                if _is_number(number):
                    flat[f"{split}/{metric}"] = float(number)
    return flat


def _is_number(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))
