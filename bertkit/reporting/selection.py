"""The two sides of bertkit-report's --compare: a glob over run directories, or a selection by
settings ("finetuning=llrd", "learning_rate=2e-5 seed=1").

A side is a selection when every item of it is KEY=VALUE; items are separated by spaces or by
commas (so a job directory's name, Hydra's override_dirname "finetuning=llrd,seed=2", is a
selection of its settings); anything else is a glob (fnmatch over run directories relative to
the outputs directory, '*' also matching '/'). A KEY is any setting of the runs' configs: the
full dotted key (trainer.learning_rate), a config group for its choice (finetuning for
finetuning.name), or a dotted suffix that names one key alone (learning_rate); where a
suffix names several, the one that can change a result (never a result-neutral key such as
logger.name over another) and, among those, the one the runs differ by. A VALUE is read as Hydra
reads an override's (2e-5 is the float 0.00002, true and True the boolean) and compared with
the run's value as the report compares settings (identity.canonical).

A side that matches no run is one line that says what exists: the values of the key that
emptied it, the keys the runs differ by, or (for a glob) some of the run directories.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from bertkit.errors import BertkitError
from bertkit.reporting.identity import CHOICE_KEYS, canonical, neutral

# KEY=VALUE: a dotted key without a glob's or a path's characters (rte/finetuning=llrd is a
# glob over directories).
ITEM = re.compile(r"^[A-Za-z_][\w.-]*=")
SHOWN = 12  # values, keys or run directories named in a no-match message before "N more"


@dataclass(frozen=True)
class Side:
    """One side of a --compare: its text, and its settings {full key: value} when it is a
    selection (None: a glob)."""

    text: str
    settings: dict[str, object] | None

    @property
    def label(self) -> str:
        """How the significance table names this side: the selection as typed, or the glob."""
        return self.text

    def describe(self) -> str:
        if self.settings is None:
            return f"runs matching `{self.text}`"
        return "runs with " + ", ".join(f"`{k}={typed(v)}`" for k, v in self.settings.items())


def split_items(text: str) -> list[str]:
    """The items of a side, split at spaces and commas outside brackets and quotes (a list
    value [query,value] stays one item)."""
    items, current, depth, quote = [], "", 0, ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{(":
            depth += 1
        elif char in "]})":
            depth = max(depth - 1, 0)
        elif depth == 0 and (char == "," or char.isspace()):
            items.append(current)
            current = ""
            continue
        current += char
    return [item for item in [*items, current] if item]


def is_selection(text: str) -> bool:
    items = split_items(text)
    return bool(items) and all(ITEM.match(item) for item in items)


def resolve_side(text: str, runs: Sequence, root: Path, relative_dir) -> tuple[Side, list]:
    """The side's description and its runs; a side that matches none is a BertkitError of one
    line saying what exists. relative_dir(path, root): a run directory as the glob sees it."""
    if not is_selection(text):
        chosen = [r for r in runs if fnmatch(relative_dir(r.run_dir, root), text)]
        if not chosen:
            dirs = sorted({relative_dir(r.run_dir, root) for r in runs})
            raise BertkitError(f"--compare: {text!r} matches no run directory under {root}; "
                               f"run directories: {_some(dirs)}")
        return Side(text, None), chosen
    wanted = {}
    for item in split_items(text):
        key, value = _parse(item)
        wanted[resolve_key(key, runs)] = value
    chosen = list(runs)
    for number, (key, value) in enumerate(wanted.items()):
        matching = [r for r in chosen if key in r.config
                    and same_value(r.config[key], value)]
        if not matching:
            among = "" if number == 0 else " among the runs with " + ", ".join(
                f"{k}={typed(v)}" for k, v in list(wanted.items())[:number])
            values = sorted({typed(r.config[key]) for r in chosen if key in r.config},
                            key=_number_first)
            raise BertkitError(f"--compare: no run has {key}={typed(value)}{among}; "
                               f"its values: {_some(values) if values else '(none)'}")
        chosen = matching
    return Side(text, wanted), chosen


def _parse(item: str) -> tuple[str, object]:
    """KEY and VALUE of one item, the value as Hydra reads an override's."""
    try:
        override = OverridesParser.create().parse_override(item)
        if override.is_sweep_override():
            raise BertkitError(f"--compare: {item!r}: one value per key (separate several "
                               f"settings with spaces)")
        return override.key_or_group, override.value()
    except HydraException:  # not Hydra's grammar (an unbalanced bracket ...): as written
        key, _, value = item.partition("=")
        return key, value


def resolve_key(key: str, runs: Sequence) -> str:
    """The full config key a selection's KEY names (see the module's docstring)."""
    keys = set().union(*(r.config for r in runs))
    if key in keys:
        return key
    found = sorted(k for k in keys if _names(k, key))
    if len(found) > 1:  # result-neutral keys (logger.name) never win over one that counts
        found = [k for k in found if not neutral(k)] or found
    if len(found) > 1:  # prefer the keys the runs differ by: the report's row keys first
        found = ([k for k in found if k in listed_keys(runs)]
                 or [k for k in found if k in differing_keys(runs)] or found)
    if len(found) == 1:
        return found[0]
    if found:
        raise BertkitError(f"--compare: {key!r} names several settings: {_some(found)}; "
                           f"give the full key")
    raise BertkitError(f"--compare: no setting {key!r} in the runs' configs; the runs differ "
                       f"by: {_some(listed_keys(runs)) or '(nothing)'}")


def _names(full: str, key: str) -> bool:
    """Whether key names the full key: its dotted suffix, or a group for its choice."""
    stems = [full] + [full.removesuffix(s) for s in CHOICE_KEYS if full.endswith(s)]
    return any(stem == key or stem.endswith("." + key) for stem in stems)


def differing_keys(runs: Sequence) -> set[str]:
    keys = set().union(*(r.config for r in runs))
    return {k for k in keys
            if len({canonical(r.config[k]) if k in r.config else None for r in runs}) > 1}


def listed_keys(runs: Sequence) -> list[str]:
    """The keys the runs differ by, result-neutral ones (log settings, paths of caches) aside:
    the report's row keys, the grid's and the seed."""
    return sorted(k for k in differing_keys(runs) if not neutral(k))


def same_value(found: object, wanted: object) -> bool:
    return canonical(found) == canonical(wanted) or str(found) == str(wanted)


def typed(value: object) -> str:
    """A value as one would type it in a selection: 2e-05, true, null, llrd."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _number_first(text: str) -> tuple:
    """Numbers in numeric order, before other values in text order."""
    try:
        return (0, float(text), text)
    except ValueError:
        return (1, 0.0, text)


def _some(names: Sequence[str]) -> str:
    more = len(names) - SHOWN
    return ", ".join(names[:SHOWN]) + (f" and {more} more" if more > 0 else "")
