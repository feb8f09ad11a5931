"""A GLUE task's classes under two spellings: task.labels, the strings its files and the GLUE
leaderboard write ('0'/'1' for CoLA, SST-2, MRPC, QQP, WNLI), whose positions are the class
ids; and task.class_names, what GLUE and nyu-mll/glue call those classes, which the saved
model's id2label/label2id carry (and so the text-classification pipeline's labels)."""

from __future__ import annotations

from omegaconf import DictConfig

from bertkit.errors import BertkitError


def file_labels(task: DictConfig) -> list[str] | None:
    """Class id -> the files' label string; None for a regression task."""
    return [str(label) for label in task.labels] if task.labels is not None else None


def class_names(task: DictConfig) -> list[str] | None:
    """Class id -> its name (task.class_names, in the order of task.labels); None for a
    regression task."""
    labels = file_labels(task)
    names = task.class_names
    if labels is None:
        if names is not None:
            raise BertkitError(f"task.class_names={list(names)} but task.labels is null (a "
                               f"regression task has no classes): set task.class_names=null")
        return None
    if names is None:
        raise BertkitError(f"task.class_names is null for the classification task {task.name}: "
                           f"give one name per entry of task.labels {labels}")
    names = [str(name) for name in names]
    if len(names) != len(labels) or len(set(names)) != len(names):
        raise BertkitError(f"task.class_names={names}: expected {len(labels)} distinct names, "
                           f"one per entry of task.labels {labels}, in its order")
    return names

