"""The task families, one folder each (glue, squad, swag, ner): their readers, features,
metrics, output files and the small family spec the finetune template runs
(bertkit.training.finetune).

A family imports `bertkit.data` and `bertkit.training`, never another family. The registry
below names each family's spec by module path, so that callers (the CLI, pretraining's
downstream finetunes) pick a family by name without importing any of them up front.
"""

from __future__ import annotations

import importlib

from bertkit.errors import BertkitError

# task.family -> the module whose FAMILY is that family's spec (bertkit.training.family).
FAMILIES = {
    "glue": "bertkit.tasks.glue.family",
    "squad": "bertkit.tasks.squad.family",
    "swag": "bertkit.tasks.swag.family",
    "ner": "bertkit.tasks.ner.family",
}


def task_family(name: str):
    """The TaskFamily of task.family=name, imported on first use."""
    if name not in FAMILIES:
        raise BertkitError(f"task.family={name!r}: no such task family (expected one of "
                           f"{', '.join(FAMILIES)})")
    return importlib.import_module(FAMILIES[name]).FAMILY
