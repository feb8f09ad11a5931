"""The one way bertkit finds the parts a setting names: a table of name -> "module:attribute"
in the package that holds them, imported on first use. The task families
(bertkit.tasks.FAMILIES), the jobs (bertkit.jobs.JOBS) and the finetuning methods
(bertkit.finetuning.methods.METHODS) are such tables: a reader sees every choice in one
place, and picking one imports only its module (the CLI starts without importing every
benchmark and family)."""

from __future__ import annotations

import importlib


def imported(entry: str):
    """The attribute an entry "package.module:attribute" names, its module imported."""
    module, _, attribute = entry.partition(":")
    return getattr(importlib.import_module(module), attribute)
