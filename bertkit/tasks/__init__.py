"""The task families, one folder each (glue, squad, swag, ner): their readers, features,
metrics, output files and the small family spec the finetune job runs
(bertkit.training.finetune).

A family imports `bertkit.data` and `bertkit.training`, never another family. The table
below names each family's spec ("module:attribute", resolved by pkgutil.resolve_name), so
that callers (the CLI, pretraining's downstream finetunes) pick a family by name without
importing any of them up front.
"""

from __future__ import annotations

from pkgutil import resolve_name as imported

from bertkit.errors import BertkitError

# task.family -> that family's spec (bertkit.training.finetune.TaskFamily).
FAMILIES = {
    "glue": "bertkit.tasks.glue.family:FAMILY",
    "squad": "bertkit.tasks.squad.family:FAMILY",
    "swag": "bertkit.tasks.swag.family:FAMILY",
    "ner": "bertkit.tasks.ner.family:FAMILY",
}


def task_family(name: str):
    """The TaskFamily of task.family=name, imported on first use."""
    if name not in FAMILIES:
        raise BertkitError(f"task.family={name!r}: no such task family (expected one of "
                           f"{', '.join(FAMILIES)})")
    return imported(FAMILIES[name])
