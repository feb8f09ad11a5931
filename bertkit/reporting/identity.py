"""Which runs are seeds of one configuration: the report's rows, and their short names.

A row is every setting in which a task's runs differ, the seed, what cannot change a result
and the paper's grid (result_neutral.yaml) aside: two runs that differ in trainer.max_steps,
warm-up, a finetuning method's setting or the model are never averaged as if they were seeds.
A setting that some runs of a task record and others do not (a run without config.yaml
records only metrics.json's hyperparameters) cannot be compared: it splits rows too, and the
report names it. Inside a row the grid point with the best mean is chosen (writer.py).

Names are short: the model's name, then each setting that splits the rows as key=value, with
a config group's choice shown as group=choice (finetuning=llrd, masking=dynamic) and the keys
that come with that choice left out.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from functools import cache
from pathlib import Path, PurePosixPath

import yaml

from bertkit.data.job_overrides import short_key

NEUTRAL_FILE = Path(__file__).with_name("result_neutral.yaml")
MODEL_KEY = "model.name_or_path"
STARTED_FROM = "model.started_from"
DATA_KEY = "data.fingerprint"  # the content of a run's splits (metrics.json details)
# The value of a key naming a local checkpoint, tokenizer or corpus in a run that recorded
# what it read there (metrics.json's details.input_fingerprints): "content:<fingerprint>".
CONTENT = "content:"
PRETRAINING = "pretraining."  # the prefix of a downstream run's pretraining settings
UNKNOWN = "?"  # shown for a setting a run does not record


@cache
def _patterns() -> dict[str, tuple[str, ...]]:
    data = yaml.safe_load(NEUTRAL_FILE.read_text(encoding="utf-8"))
    return {name: tuple(data[name])
            for name in ("replicate", "neutral", "grid", "data_location")}


def ignored(key: str) -> bool:
    """Whether key never splits a row: the seed, a result-neutral setting, or (not under
    pretraining.) one of the grid's keys."""
    patterns = _patterns()
    bare = key.removeprefix(PRETRAINING)
    if any(fnmatchcase(bare, p) for p in patterns["replicate"] + patterns["neutral"]):
        return True
    return bare == key and any(fnmatchcase(key, p) for p in patterns["grid"])


def neutral(key: str) -> bool:
    """Whether key cannot change a result (result_neutral.yaml's neutral: log settings, a
    cache's path, ...), under pretraining. too."""
    return any(fnmatchcase(key.removeprefix(PRETRAINING), p) for p in _patterns()["neutral"])


def flatten(node: object, prefix: str = "") -> dict[str, object]:
    """{"trainer": {"max_steps": 3}} -> {"trainer.max_steps": 3}; lists and empty mappings
    are values."""
    if not isinstance(node, Mapping) or (not node and prefix):
        return {prefix: node}
    flat: dict[str, object] = {}
    for key, value in node.items():
        flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def run_settings(config: Mapping, prefix: str = "", data_fingerprint: str | None = None,
                 input_fingerprints: Mapping[str, str] | None = None) -> dict[str, object]:
    """The settings of one run that can split a row, from its resolved config (or its
    hyperparameters), keys prefixed by prefix. With the data's content fingerprint, that
    stands for the paths the data was read from; with input_fingerprints ({key: fingerprint}
    of a local checkpoint, tokenizer or corpus), the key's value is what the run read there
    (CONTENT + fingerprint), not its path. A run without them (from before they were
    recorded) keeps its paths: compared by path with its likes, and never pooled with a run
    that recorded the content."""
    flat = flatten(config)
    if data_fingerprint is not None:
        flat = {k: v for k, v in flat.items()
                if not any(fnmatchcase(k, p) for p in _patterns()["data_location"])}
        flat[DATA_KEY] = data_fingerprint
    started_from = flat.pop(STARTED_FROM, None)  # every config holds it: null but in STILTs
    if started_from is not None:
        # The second stage of a two-stage run (STILTs) loads the encoder its first stage
        # saved, one path per seed: the model is the checkpoint it all started from.
        flat[MODEL_KEY] = started_from
    for key, fingerprint in (input_fingerprints or {}).items():
        flat[key] = CONTENT + fingerprint  # model.name_or_path: the checkpoint it started from
    flat = {f"{prefix}{k}": v for k, v in flat.items()}
    return {k: v for k, v in flat.items() if not ignored(k)}


def canonical(value: object) -> str:
    """One string per value, so that 2e-05 and 2.0e-5, or a tuple and a list, are equal."""
    if isinstance(value, float) and value.is_integer() and math.isfinite(value):
        value = int(value)
    return json.dumps(value, sort_keys=True, default=str)


def short_value(value: object) -> str:
    """A value as one table cell: lists inline ([query, value]), a path as its last part."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(short_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {short_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, float):
        return f"{value:g}"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    text = str(value)
    if "/" in text and not text.startswith(("http://", "https://")):
        text = PurePosixPath(text.rstrip("/")).name or text
    return text


def model_name(model: str) -> str:
    """all-MiniLM-L6-v2 for /root/.cache/bertkit/models/all-MiniLM-L6-v2 (and for the Hub's
    sentence-transformers/all-MiniLM-L6-v2)."""
    return short_value(model) or "(no model)"


@dataclass(frozen=True)
class RowSplit:
    """The keys that split a report's rows, and a name for each row."""

    keys: tuple[str, ...]  # settings that differ between runs of one task
    unknown: tuple[str, ...]  # of those, the ones some runs do not record
    unrecorded_runs: int  # runs missing at least one of `unknown`
    common: Mapping[str, str]  # key -> the value most rows have, left out of their names
    _names: Mapping[tuple, str]
    labels: Mapping[str, str] = None  # key -> how names show it (masking for masking.kind)
    implied: frozenset = frozenset()  # keys a group's choice says (left out of names)

    @classmethod
    def of(cls, runs: Sequence) -> RowSplit:
        by_task: dict[str, list] = {}
        for run in runs:
            by_task.setdefault(run.task, []).append(run)
        keys: set[str] = set()
        unknown: set[str] = set()
        for of_task in by_task.values():
            all_keys = set().union(*(run.settings for run in of_task))
            for key in all_keys:
                values = {_value(run, key) for run in of_task}
                if len(values) > 1:
                    keys.add(key)
                    if UNKNOWN in values:
                        unknown.add(key)
        ordered = tuple(sorted(keys, key=lambda k: (k != MODEL_KEY, k)))
        unrecorded = sum(1 for run in runs if any(k not in run.settings for k in unknown))
        common, names, labels = _names(runs, ordered)
        return cls(ordered, tuple(sorted(unknown)), unrecorded, common, names, labels,
                   frozenset(_implied_by_choice(runs, ordered)))

    def key(self, run) -> tuple:
        return _row(run, self.keys)

    def name(self, run) -> str:
        return self._names[self.key(run)]

    def differing(self, run) -> dict[str, str]:
        """The run's values of the keys that split rows, as shown."""
        return {k: _shown(run, k) for k in self.keys}

    def other_factors(self, runs: Sequence, compared: Sequence[str]) -> tuple[str, ...]:
        """The row keys besides the compared ones, and besides the keys a compared choice
        says (objective.sentence_task with objective.name): the factors of a factorial
        design at each level of which a comparison of the compared keys is made."""
        compared = set(compared)

        def said(key: str) -> bool:
            choices = [c for c in compared
                       if _group_of(c) and key.startswith(_group_of(c) + ".")]
            return any(all(len({_value(r, key) for r in runs if _value(r, c) == v}) <= 1
                           for v in {_value(r, c) for r in runs}) for c in choices)

        return tuple(k for k in self.keys if k not in compared and not said(k))

    def level(self, run, keys: Sequence[str]) -> tuple:
        """The run's level of the factors `keys` (its marks, partial data, apart too)."""
        return (*(_value(run, k) for k in keys), marks(run))

    def level_name(self, run, keys: Sequence[str]) -> str:
        """"objective=mlm": the run's values of keys as row names show them (keys a choice
        among them says are left to it), its marks (partial data) in brackets."""
        choices = {_group_of(k) for k in keys if _group_of(k)}
        shown = [k for k in keys if not (k in self.implied and any(
            k.startswith(g + ".") for g in choices))]
        labels = self.labels or {}
        parts = [f"{labels.get(k, k.removeprefix(PRETRAINING))}={_shown(run, k)}"
                 for k in shown]
        if marks(run):
            parts.append(f"({'; '.join(marks(run))})")
        return " ".join([" · ".join(parts[:len(shown)]), *parts[len(shown):]]).strip()


def _value(run, key: str) -> str:
    return canonical(run.settings[key]) if key in run.settings else UNKNOWN


def marks(run) -> tuple[str, ...]:
    """What sets a run apart from a full run of its settings ("partial: validation 16 of
    277", a pretraining run scored on its last training window): never pooled with runs
    without it, and said in its row's name."""
    return tuple(getattr(run, "marks", ()))


def _row(run, keys: Sequence[str]) -> tuple:
    return (*(_value(run, k) for k in keys), marks(run))


def _shown(run, key: str) -> str:
    return short_value(run.settings[key]) if key in run.settings else UNKNOWN


def _names(runs: Sequence, keys: tuple[str, ...]) -> tuple[dict[str, str], dict[tuple, str]]:
    """A short, unique name per row: the model, a group's choice where it differs
    (finetuning=llrd), then each setting in which the row differs from the value most rows
    have (where one value has more rows than any other; on a tie every row shows its own).
    Keys a group's choice implies are left to the choice. Where two
    rows would still share a name, those rows are named by every key with its full value.
    Returns the common values left out of names, and the names."""
    representatives: dict[tuple, object] = {}
    for run in runs:
        representatives.setdefault(_row(run, keys), run)
    implied = _implied_by_choice(runs, keys)
    # A group's choice before the group's other settings (finetuning=llrd, layer_lr_decay).
    shown = sorted((k for k in keys if k != MODEL_KEY and k not in implied),
                   key=lambda k: _group_of(k) or k)
    common = {}
    for key in (k for k in shown if not _group_of(k)):  # a group's choice is always named
        ranked = Counter(_shown(run, key) for run in representatives.values()).most_common(2)
        if len(ranked) == 1 or ranked[0][1] > ranked[1][1]:
            common[key] = ranked[0][0]
    # A choice (x.name) is shown as its group: finetuning=llrd.
    groups = {k: _group_of(k) or k for k in shown}
    labels = {k: short_key(groups[k], list(groups.values())) for k in shown}
    names = {}
    for row, run in representatives.items():
        parts = [f"{labels[k]}={_shown(run, k)}" for k in shown
                 if common.get(k) != _shown(run, k)]
        if not parts or MODEL_KEY in keys or not _pretrained_here(run):
            # An arm of a pretraining is named by its settings alone (masking=dynamic), its
            # model being "pretrained on <corpus>" for every row.
            parts.insert(0, model_name(_model(run)))
        names[row] = " · ".join(parts)
    same_name: dict[str, list[tuple]] = {}
    for row, name in names.items():
        same_name.setdefault(name, []).append(row)
    for name, rows in same_name.items():
        if len(rows) > 1:  # values alike when shortened (two paths to one directory name)
            apart = [i for i, key in enumerate(keys) if len({row[i] for row in rows}) > 1]
            for row in rows:
                run = representatives[row]
                names[row] = " · ".join([name] + [
                    f"{keys[i]}={run.settings.get(keys[i], UNKNOWN)}" for i in apart])
    for row, run in representatives.items():
        if marks(run):
            names[row] += f" ({'; '.join(marks(run))})"
    return {k: common[k] for k in shown if k in common}, names, labels


def _pretrained_here(run) -> bool:
    """A pretraining run, or a finetune of a checkpoint pretrained by bertkit (it records the
    pretraining's settings)."""
    return any(k.startswith(PRETRAINING) for k in run.settings)


def _model(run) -> str:
    """The model a run finetuned: its config's (None for a from-scratch model, or its content
    for a local checkpoint: then what metrics.json calls it, its path)."""
    model = run.settings.get(MODEL_KEY)
    return str(run.model if not model or str(model).startswith(CONTENT) else model)


CHOICE_KEYS = (".name", ".kind")  # finetuning.name=llrd, masking.kind=dynamic


def _group_of(key: str) -> str | None:
    """finetuning for finetuning.name: a config group whose choice the key records."""
    return next((key.removesuffix(s) for s in CHOICE_KEYS if key.endswith(s)), None)


def _implied_by_choice(runs: Sequence, keys: tuple[str, ...]) -> set[str]:
    """Keys under a config group whose choice splits rows (finetuning.name) that take one
    value per choice: the choice's name says them (finetuning=llrd, not also
    layer_lr_decay=0.95)."""
    groups = {g for g in map(_group_of, keys) if g}
    implied = set()
    for key in keys:
        group = next((g for g in groups if key.startswith(g + ".") and not _group_of(key)),
                     None)
        if group is None:
            continue
        choice_key = next(k for k in keys if _group_of(k) == group)
        per_choice: dict[str, set[str]] = {}
        for run in runs:
            per_choice.setdefault(_value(run, choice_key), set()).add(_value(run, key))
        if all(len(values) == 1 for values in per_choice.values()):
            implied.add(key)
    return implied

