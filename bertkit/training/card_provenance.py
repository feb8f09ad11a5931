"""What a model card may say about where a model and its data came from: the base model of a
local checkpoint (a Hub id, found in the checkpoint itself), and every path made portable, so
that a card names no directory of the machine that trained the model (its home, its cache, a
temporary directory)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import yaml
from huggingface_hub import metadata_load
from huggingface_hub.utils import HFValidationError, validate_repo_id

CARD_FILE = "README.md"
CONFIG_FILE = "config.json"

# An absolute path inside a longer text (a command's `task.data_dir=/x/y`, a list of paths):
# `/` or `~/` at the start or after a space, `=`, a bracket, a comma or a quote (not after `:`
# or a word character, so URLs and ratios like 1/2 stay), up to the next such separator.
_EMBEDDED_PATH = re.compile(r"(?<![^\s=\[({,'\"`])~?/[^\s,'\"\])}|`]+")


def is_repo_id(name: str) -> bool:
    """A valid Hub repository id (`name` or `owner/name`), whether or not it exists."""
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def hub_id(name: str | None) -> str | None:
    """`name` when it names something on the Hub (base_model, datasets must): not a local
    path, and a valid repository id."""
    if not name or Path(name).expanduser().exists() or not is_repo_id(name):
        return None
    return name


def portable_path(path: str) -> str:
    """An absolute path relative to the working directory when it lies inside it, else its
    last component (a directory's name)."""
    resolved = Path(os.path.expanduser(path))
    cwd = Path.cwd()
    if cwd != Path(cwd.anchor) and resolved != cwd and resolved.is_relative_to(cwd):
        return resolved.relative_to(cwd).as_posix()
    return resolved.name or path


def without_absolute_paths(value):
    """`value` (a string, or lists and dicts of them) with every absolute path made portable;
    anything else as it is."""
    if isinstance(value, str):
        if os.path.isabs(os.path.expanduser(value)):
            return portable_path(value)
        return _EMBEDDED_PATH.sub(lambda match: portable_path(match.group()), value)
    if isinstance(value, dict):
        return {key: without_absolute_paths(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(without_absolute_paths(item) for item in value)
    return value


def model_reference(name: str) -> str:
    """How a card names a model: its Hub id, or a local checkpoint's portable path."""
    return name if hub_id(name) else without_absolute_paths(name)


def _hub_ids(value) -> str | list[str] | None:
    values = [value] if isinstance(value, str) else list(value or [])
    found = [item for item in values if isinstance(item, str) and hub_id(item)]
    if not found:
        return None
    return found[0] if isinstance(value, str) or len(found) == 1 else found


def checkpoint_base_model(name: str | None) -> str | list[str] | None:
    """The Hub model a local checkpoint directory comes from: `base_model` in its own card
    (README.md metadata, as the Hub and bertkit write it), else `_name_or_path` in its
    config.json when that is a Hub id (what it was loaded from before it was saved; the
    extracted MiniLM says nreimers/MiniLM-L6-H384-uncased). None: not a directory, or nothing
    names a Hub model."""
    if not name:
        return None
    directory = Path(name).expanduser()
    if not directory.is_dir():
        return None
    if (directory / CARD_FILE).is_file():
        try:
            metadata = metadata_load(directory / CARD_FILE) or {}
        except (ValueError, UnicodeDecodeError, yaml.YAMLError):  # a README.md but no card
            metadata = {}
        found = _hub_ids(metadata.get("base_model"))
        if found:
            return found
    config = directory / CONFIG_FILE
    if config.is_file():
        try:
            name_or_path = json.loads(config.read_text(encoding="utf-8")).get("_name_or_path")
        except (ValueError, UnicodeDecodeError, AttributeError):
            return None
        return _hub_ids(name_or_path)
    return None
