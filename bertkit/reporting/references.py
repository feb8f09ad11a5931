"""Published scores to compare bertkit's runs with: published_scores.yaml beside this module,
read and checked.

Each entry (a key such as bert_base_paper_test) has a label, its source (paper, table), the
split its numbers were measured on (dev or test: the GLUE numbers of Devlin et al. are test
server numbers, bertkit's runs are scored on dev), the model names it applies to, and per
bertkit task the score in percent of that task's main metric (conf/task/<task>.yaml
main_metric), so that a reference and a run always measure the same thing.

The file is report data, not configuration: it lives in the package (found from this module's
own path, shipped in the wheel), outside Hydra's search path.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bertkit.config_tree import config_dir
from bertkit.errors import BertkitError
from bertkit.reporting.tables import one_line

FILE_NAME = "published_scores.yaml"
SPLITS = ("dev", "test")
ENTRY_KEYS = {"label", "source", "split", "models", "scores"}
SCORE_KEYS = {"metric", "value", "note"}
TASK_GROUP = "task"  # conf/task: one YAML per task, bases in subfolders
MISSING = "???"  # Hydra's mandatory value: a base's placeholder, not a value
SELF = "_self_"


@dataclass(frozen=True)
class Reference:
    key: str
    label: str  # names the split, e.g. "BERT-base (Devlin et al. 2019, GLUE test)"
    source: str
    split: str  # "dev" or "test"
    models: tuple[str, ...]
    scores: dict[str, float]  # task -> score in percent (points)
    metrics: dict[str, str]  # task -> metric of the score (the task's main metric)
    notes: dict[str, str] = field(default_factory=dict)  # task -> remark

    def as_dict(self) -> dict:
        return {"key": self.key, "label": self.label, "source": self.source,
                "split": self.split, "models": list(self.models), "scores": dict(self.scores),
                "metrics": dict(self.metrics), "notes": dict(self.notes)}


def default_references_path() -> Path:
    return Path(__file__).resolve().with_name(FILE_NAME)


def task_main_metrics(conf_dir: str | Path | None = None) -> dict[str, str]:
    """{task name: main_metric} of conf/task/*.yaml; a key a task file does not give is
    inherited through its defaults list, as Hydra composes it: squad_v2 from squad_v1, a GLUE
    task from glue/standard and glue/base (conf/task/glue/, bases, not tasks)."""
    if conf_dir is None:
        conf_dir = config_dir()
    task_dir = Path(conf_dir) / TASK_GROUP
    files: dict[str, dict] = {}

    def load(key: str) -> dict:
        if key not in files:
            path = task_dir / f"{key}.yaml"
            data = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else None
            files[key] = data if isinstance(data, dict) else {}
        return files[key]

    def lookup(key: str, name: str, seen: tuple = ()):
        data = load(key)
        if name in data and data[name] != MISSING:
            return data[name]
        for parent in data.get("defaults") or []:
            parent_key = _task_default(key, parent)
            if parent_key is not None and parent_key not in seen + (key,):
                value = lookup(parent_key, name, seen + (key,))
                if value is not None:
                    return value
        return None

    tasks = [path.stem for path in sorted(task_dir.glob("*.yaml"))]
    return {str(lookup(stem, "name") or stem): str(lookup(stem, "main_metric"))
            for stem in tasks if lookup(stem, "main_metric") is not None}


def _task_default(key: str, entry: object) -> str | None:
    """The task-group file (relative to conf/task, no suffix) that a defaults entry of task
    file `key` names: `squad_v1`, `glue/standard@_here_` (relative to the file's folder) or
    `/task/glue/base@_here_` (absolute); None for _self_, overrides and other groups."""
    if not isinstance(entry, str) or entry == SELF:
        return None
    path = entry.split("@", 1)[0]
    if path.startswith("/"):
        group, _, rest = path.lstrip("/").partition("/")
        return rest if group == TASK_GROUP and rest else None
    folder = key.rpartition("/")[0]
    return f"{folder}/{path}" if folder else path


def load_references(path: str | Path | None = None,
                    main_metrics: dict[str, str] | None = None) -> dict[str, Reference]:
    """Every entry of the references file, checked: a missing key, a score that is not a
    number of points, a task bertkit does not have, or a metric other than the task's main
    metric is one BertkitError naming the file and the key."""
    path = Path(path) if path is not None else default_references_path()
    main_metrics = task_main_metrics() if main_metrics is None else main_metrics
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise BertkitError(f"{path}: cannot read the references file: {err}") from None
    except yaml.YAMLError as err:
        raise BertkitError(f"{path}: not valid YAML: {one_line(err)}") from None
    if not isinstance(data, dict) or not data:
        raise BertkitError(f"{path}: expected a mapping of reference keys to entries")
    return {str(key): _entry(path, str(key), entry, main_metrics)
            for key, entry in data.items()}


def _entry(path: Path, key: str, entry: object, main_metrics: dict[str, str]) -> Reference:
    where = f"{path}: {key}"
    if not isinstance(entry, dict):
        raise BertkitError(f"{where}: expected a mapping with {', '.join(sorted(ENTRY_KEYS))}")
    unknown = sorted(set(map(str, entry)) - ENTRY_KEYS)
    if unknown:
        raise BertkitError(f"{where}.{unknown[0]}: unknown key (expected "
                           f"{', '.join(sorted(ENTRY_KEYS))})")
    for name in sorted(ENTRY_KEYS):
        if name not in entry:
            raise BertkitError(f"{where}.{name}: missing")
    for name in ("label", "source", "split"):
        if not isinstance(entry[name], str) or not entry[name].strip():
            raise BertkitError(f"{where}.{name}: expected a non-empty string")
    split, label = entry["split"], entry["label"]
    if split not in SPLITS:
        raise BertkitError(f"{where}.split: {split!r} is not one of {', '.join(SPLITS)}")
    if not re.search(rf"\b{split}\b", label, flags=re.IGNORECASE):
        raise BertkitError(f"{where}.label: {label!r} does not name its split ({split}); the "
                           f"table row must say whether the reference is a {split} score")
    models = entry["models"]
    if (not isinstance(models, list) or not models
            or not all(isinstance(m, str) and m for m in models)):
        raise BertkitError(f"{where}.models: expected a list of model names")
    if not isinstance(entry["scores"], dict) or not entry["scores"]:
        raise BertkitError(f"{where}.scores: expected a mapping of bertkit task names to "
                           f"scores")
    scores, metrics, notes = {}, {}, {}
    for task, score in entry["scores"].items():
        at = f"{where}.scores.{task}"
        if task not in main_metrics:
            raise BertkitError(f"{at}: unknown task (bertkit's tasks: "
                               f"{', '.join(sorted(main_metrics))})")
        if not isinstance(score, dict):
            raise BertkitError(f"{at}: expected a mapping with metric and value")
        unknown = sorted(set(map(str, score)) - SCORE_KEYS)
        if unknown:
            raise BertkitError(f"{at}.{unknown[0]}: unknown key (expected metric, value, "
                               f"note)")
        for name in ("metric", "value"):
            if name not in score:
                raise BertkitError(f"{at}.{name}: missing")
        value, metric = score["value"], score["metric"]
        if (not isinstance(value, (int, float)) or isinstance(value, bool)
                or not math.isfinite(value) or not -100.0 <= value <= 100.0):
            raise BertkitError(f"{at}.value: {value!r} is not a score in points (a number "
                               f"from -100 to 100)")
        if metric != main_metrics[task]:
            raise BertkitError(f"{at}.metric: {metric!r} is not {task}'s main metric "
                               f"({main_metrics[task]}); only main-metric scores can be "
                               f"compared with bertkit's runs")
        if "note" in score and not isinstance(score["note"], str):
            raise BertkitError(f"{at}.note: expected a string")
        scores[task], metrics[task] = float(value), metric
        if score.get("note"):
            notes[task] = score["note"]
    return Reference(key=key, label=label, source=entry["source"], split=split,
                     models=tuple(models), scores=scores, metrics=metrics, notes=notes)


def _model_names(name: str) -> set[str]:
    """A model name and its last path component: bert-base-uncased matches
    google-bert/bert-base-uncased and a local /models/bert-base-uncased."""
    name = name.rstrip("/")
    return {name, name.rsplit("/", 1)[-1]} if name else set()


def matches_model(reference: Reference, model: str) -> bool:
    """True when the run's model is one of the reference's models, by full name or by its last
    path component (a Hub name with or without its organisation, a local copy's folder)."""
    wanted = set()
    for name in reference.models:
        wanted |= _model_names(name)
    return bool(_model_names(model) & wanted)


def choose_references(references: dict[str, Reference], keys: Iterable[str] | None,
                      models: Iterable[str]) -> tuple[list[Reference], bool]:
    """(the references to show, whether they were named explicitly).

    keys None: every reference whose models match one of the runs' models (none when nothing
    matches). ["none"]: none. Otherwise the named ones, in the order given; an unknown name
    is a BertkitError listing the known ones.
    """
    if keys is None:
        models = list(models)
        return [r for r in references.values()
                if any(matches_model(r, m) for m in models)], False
    keys = list(keys)
    if keys == ["none"]:
        return [], True
    if "none" in keys:
        raise BertkitError("--reference none cannot be combined with reference keys")
    chosen = []
    for key in keys:
        if key not in references:
            raise BertkitError(f"--reference {key}: no such reference (known: "
                               f"{', '.join(references)})")
        if references[key] not in chosen:
            chosen.append(references[key])
    return chosen, True

