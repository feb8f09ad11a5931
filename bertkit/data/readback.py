"""One verifying reader per format for every file bertkit reads back (Arrow, JSON, YAML, text).

The rule: a file that a crash, a full disk or a partial copy cut is never read as data. Each
reader checks that the file is whole before anything uses it and raises DamagedFile, one line
naming the file, when it is not. Callers decide what a damaged file means: a cache entry is
deleted and rebuilt (`discard_damaged`), a result is refused (the report names it and goes on).

Arrow files are datasets' IPC streams; a stream cut at a record-batch boundary still parses, so
the check also requires the end-of-stream marker the writer puts last. Only message headers are
read (the bodies are memory-mapped, not copied), so checking a large cache costs little.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import yaml

from bertkit.errors import BertkitError

logger = logging.getLogger(__name__)

END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # Arrow IPC: continuation, length 0
SAVED_DATASET_FILES = ("state.json", "dataset_info.json")
JSON_NAMES = {dict: "object", list: "array", str: "string", int: "number", float: "number",
              bool: "boolean", type(None): "null"}
YAML_NAMES = {dict: "mapping", list: "list", type(None): "empty file"}


class DamagedFile(BertkitError):
    """A file bertkit wrote earlier is cut or corrupt; the message names it."""


def _damaged(path: Path, why: object) -> DamagedFile:
    reason = " ".join(str(why).split()) or type(why).__name__
    return DamagedFile(f"{path}: {reason}")


def read_text(path: str | os.PathLike) -> str:
    """A UTF-8 text file bertkit wrote."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise _damaged(path, f"cannot read: {err}") from None


def read_json(path: str | os.PathLike, expect: type = dict):
    """A JSON file holding one value of type `expect` (an object unless told)."""
    path = Path(path)
    try:
        data = json.loads(read_text(path))
    except json.JSONDecodeError as err:
        raise _damaged(path, f"not valid JSON: {err}") from None
    if not isinstance(data, expect):
        raise _damaged(path, f"expected a JSON {JSON_NAMES.get(expect, expect.__name__)}, "
                             f"found {JSON_NAMES.get(type(data), type(data).__name__)}")
    return data


def read_yaml(path: str | os.PathLike, expect: type = dict):
    """A YAML file holding one value of type `expect` (a mapping unless told). A document that
    opens with the start marker (---, as bertkit.data.atomic_files.write_yaml_atomic writes)
    must close with the end marker (...): a mapping cut at a line end still parses. Files
    without the start marker (written before, or by hand) are read as they are."""
    path = Path(path)
    text = read_text(path)
    if text.startswith("---\n") and not text.endswith("\n...\n"):
        raise _damaged(path, "cut YAML document: it opens with --- but does not end with ...")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise _damaged(path, f"not valid YAML: {err}") from None
    if not isinstance(data, expect):
        raise _damaged(path, f"expected a YAML {YAML_NAMES.get(expect, expect.__name__)}, "
                             f"found {YAML_NAMES.get(type(data), type(data).__name__)}")
    return data


def check_arrow(path: str | os.PathLike) -> None:
    """An Arrow IPC stream (what datasets writes) read through to its end-of-stream marker."""
    path = Path(path)
    try:
        with pa.memory_map(str(path)) as source:
            size = source.size()
            reader = pa.ipc.open_stream(source)
            for _ in reader:
                pass
            end = source.tell()
            source.seek(max(size - len(END_OF_STREAM), 0))
            tail = source.read()
    except (pa.ArrowException, OSError, ValueError) as err:
        raise _damaged(path, f"cut or corrupt Arrow file: {err}") from None
    if tail != END_OF_STREAM or end != size:
        raise _damaged(path, f"cut Arrow file: the stream ends at byte {end} of {size} without "
                             f"its end-of-stream marker")


def check_saved_dataset(directory: str | os.PathLike) -> None:
    """A Dataset.save_to_disk directory: its state, info and every data file it lists."""
    directory = Path(directory)
    state = read_json(directory / "state.json")
    read_json(directory / "dataset_info.json")
    files = state.get("_data_files")
    if not isinstance(files, list) or not files:
        raise _damaged(directory / "state.json", "lists no data file")
    for entry in files:
        check_arrow(directory / str(entry.get("filename") if isinstance(entry, dict) else ""))


def discard_damaged(paths: list[Path], check: Callable[[], None], what: str) -> bool:
    """Run `check` on a cache item; if it finds the item damaged, delete `paths` (files or
    directories) so that the caller rebuilds it. True when something was deleted."""
    try:
        check()
    except DamagedFile as err:
        logger.warning("%s; rebuilding the %s", err, what)
        for path in paths:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            elif path.exists() or path.is_symlink():
                path.unlink()
        return True
    return False


def discard_damaged_arrow_cache(root: str | os.PathLike, maps_only: bool = False) -> int:
    """Every datasets cache under root checked: a damaged map result (cache-*.arrow) is deleted,
    a damaged dataset (its Arrow data or dataset_info.json/state.json) loses its whole
    directory, the map results in it included; datasets rebuilds them on the next read.
    Directories still being written (*.incomplete, temporary files) are left alone. maps_only:
    check the map results alone (a dataset already loaded from root). Returns how many were
    deleted."""
    root = Path(root)
    if not root.is_dir():
        return 0
    deleted = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.endswith(".incomplete")
                             and not d.startswith("tmp"))
        here = Path(dirpath)
        checks = [(here / name, check_arrow) for name in sorted(filenames)
                  if name.endswith(".arrow") and (name.startswith("cache-") or not maps_only)]
        if not maps_only:
            checks += [(here / name, read_json) for name in SAVED_DATASET_FILES
                       if name in filenames]
        for path, check in checks:
            whole = not path.name.startswith("cache-") and here != root
            target = [here] if whole else [path]
            if discard_damaged(target, lambda p=path, c=check: c(p),
                               "dataset" if whole else "cached map result"):
                deleted += 1
                if whole:
                    dirnames.clear()
                    break
    return deleted
