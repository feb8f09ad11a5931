"""The NER splits of a run (train, validation, test when present) from the task config: files in
the CoNLL column format (task.data_dir with task.files, or task.*_file) or the Hub.

Each split is a Dataset with columns tokens, ner_tags (ids into task.labels, IOB2), document
and line, and has a fingerprint of its content and reading rules, so that its features are
built once and shared by every run and sweep job that reads the same data.
"""

from __future__ import annotations

import json

import datasets
from omegaconf import DictConfig, OmegaConf

from bertkit.data.cache import content_fingerprint
from bertkit.data.task_data import TaskSplits, split_files, uses_local_files
from bertkit.errors import BertkitError
from bertkit.tasks.ner.files import ConllSentences, conll_from_hub, read_conll_file

SPLITS = ("train", "validation", "test")
REQUIRED = ("train", "validation")
OPTIONAL = ("test",)  # evaluated when its file is there
FEATURES = datasets.Features({
    "tokens": datasets.List(datasets.Value("string")),
    "ner_tags": datasets.List(datasets.Value("int32")),
    "document": datasets.Value("int64"),
    "line": datasets.Value("int64"),
})


def _reading_rules(task: DictConfig) -> str:
    rules = {"labels": list(task.labels), "tag_scheme": task.tag_scheme,
             "columns": OmegaConf.to_container(task.columns)}
    return json.dumps(rules, sort_keys=True)


def _dataset(sentences: ConllSentences, labels: list[str]) -> datasets.Dataset:
    ids = {label: i for i, label in enumerate(labels)}
    table = datasets.Dataset.from_dict({
        "tokens": sentences.tokens,
        "ner_tags": [[ids[tag] for tag in tags] for tags in sentences.tags],
        "document": sentences.documents,
        "line": sentences.lines,
    }, features=FEATURES)
    return table


def load_ner_splits(task: DictConfig, data_source: str = "auto") -> TaskSplits:
    """{"train", "validation"[, "test"]} -> sentences, with each split's fingerprint and its
    tag scheme as the source had it (facts[split]["tag_scheme"])."""
    labels = list(task.labels)
    rules = _reading_rules(task)
    splits = TaskSplits({}, {})
    if uses_local_files(task, data_source):
        columns = task.columns
        files = split_files(task, REQUIRED, "the usual layout", optional=OPTIONAL)
        for split, path in files.items():
            sentences = read_conll_file(path, labels=labels, tag_scheme=task.tag_scheme,
                                        num_columns=columns.count,
                                        token_column=columns.token, tag_column=columns.tag)
            _add(splits, split, sentences, labels, content_fingerprint(rules, path.read_bytes()))
        return splits
    hub = task.hub
    loaded = conll_from_hub(hub.path, hub.name, labels=labels, tag_scheme=task.tag_scheme,
                            tokens_column=hub.columns.tokens, tags_column=hub.columns.tags,
                            document_column=hub.columns.document,
                            tag_names=list(hub.tag_names) if hub.tag_names else None,
                            revision=hub.revision)
    for split in SPLITS:
        if split not in loaded:
            if split in REQUIRED:
                raise BertkitError(f"the Hub dataset {hub.path} has no {split!r} split; it has "
                                   f"{', '.join(loaded)}")
            continue
        sentences = loaded[split]
        content = json.dumps([sentences.tokens, sentences.tags, sentences.documents])
        # tags are already by name
        _add(splits, split, sentences, labels, content_fingerprint(rules, content))
    return splits


def _add(splits: TaskSplits, split: str, sentences: ConllSentences, labels: list[str],
         fingerprint: str) -> None:
    splits.tables[split] = _dataset(sentences, labels)
    splits.fingerprints[split] = fingerprint
    splits.facts[split] = {"tag_scheme": sentences.scheme}
