"""datasets.load_dataset for the task families, with any failure (no network, an unknown
name) turned into one message that names the dataset and the local files to give instead."""

from __future__ import annotations

import datasets

from bertkit.errors import BertkitError


def load_hub_dataset(what: str, local_files: str, *args, **kwargs):
    """datasets.load_dataset(*args, **kwargs); what: "the Hub dataset X ..." for the message,
    local_files: what to give without network ("give the original JSON files: ...")."""
    try:
        return datasets.load_dataset(*args, **kwargs)
    except Exception as err:  # offline, unknown name, ...: one message, not a Hub traceback
        reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        raise BertkitError(f"could not load {what} ({reason}). Without network, "
                           f"{local_files}") from None
