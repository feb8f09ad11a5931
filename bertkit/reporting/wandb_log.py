"""Read what a W&B run stored in its transaction log (`run-<id>.wandb`), without W&B's service.

bertkit-report uses it to rebuild the results of runs whose run directories are gone but whose
W&B offline run directories (or the local copies of synced online runs) are still there; the
tests use it to check what a run logged.

Why by hand: the installed wandb (0.31) ships no Python reader of the log. The log is written
and synced by the Go service (wandb-core); `wandb.sdk.internal.datastore.DataStore`, the
reader `wandb sync` used, went away with the Python internal process (and only ever ran
inside it). This reader follows that one's format and checks; the format is small and stable:

- a 7-byte header: b":W&B", a little-endian 2-byte magic (0xBEE1) and a version byte (0);
- then a LevelDB-style log: 32 KiB blocks of records, each with a 7-byte header (CRC-32 of the
  type byte and the data, little-endian length, type FULL/FIRST/MIDDLE/LAST); a block's last
  few bytes are zero padding when no header fits;
- each reassembled record is a `wandb_internal_pb2.Record` protobuf message (run with its
  config, config updates, history, summary updates, ..., and exit with the exit code).

A log is read as it is at the moment: a run still being written, or killed, ends in a torn
record, which is dropped; such a log has no exit record (`exit_code` None). Right after
`wandb.finish()` the service may not have flushed the log yet, so a caller that has just
finished a run can wait for the exit record (`wait_for_exit`).
"""

from __future__ import annotations

import json
import struct
import time
import zlib
from pathlib import Path

from bertkit.data.atomic_files import DamagedFile
from bertkit.errors import BertkitError

BLOCK = 32 * 1024
HEADER = 7
FILE_HEADER = 7
IDENT = b":W&B"
MAGIC = 0xBEE1
VERSION = 0
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def raw_records(path: Path) -> list[bytes]:
    """The data of every complete record of the log, in order; a torn last record is dropped.

    A record whose checksum does not match, anywhere but at the torn end, is a damaged file:
    a DamagedFile (bertkit.data.atomic_files) naming it and the offset. A log cut short reads as
    a run without its exit record, never as a finished one.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise BertkitError(f"{path}: cannot read: {err}") from None
    _check_header(path, data[:FILE_HEADER])
    pos, records, pending = FILE_HEADER, [], None
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the block's tail is padding
            pos += left
            continue
        checksum, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0:  # zero padding up to the end of the block
            pos += left
            continue
        start, end = pos + HEADER, pos + HEADER + length
        if end > len(data):  # torn: the writer has not finished this record
            break
        chunk = data[start:end]
        if zlib.crc32(bytes([kind]) + chunk) & 0xFFFFFFFF != checksum:
            raise DamagedFile(f"{path}: damaged W&B log: checksum mismatch at byte {pos}")
        pos = end
        if kind == FULL:
            records.append(chunk)
            pending = None
        elif kind == FIRST:
            pending = chunk
        elif kind in (MIDDLE, LAST) and pending is not None:
            pending += chunk
            if kind == LAST:
                records.append(pending)
                pending = None
        else:
            raise DamagedFile(f"{path}: damaged W&B log: record type {kind} at byte "
                               f"{start - HEADER}")
    return records


def _check_header(path: Path, header: bytes) -> None:
    if len(header) < FILE_HEADER or header[:4] != IDENT:
        raise BertkitError(f"{path}: not a W&B transaction log (no {IDENT!r} header)")
    _, magic, version = struct.unpack("<4sHB", header)
    if (magic, version) != (MAGIC, VERSION):
        raise BertkitError(f"{path}: not a W&B transaction log of a known version (magic "
                           f"{magic:#06x}, version {version}; expected {MAGIC:#06x}, {VERSION})")


def read_records(path: Path) -> list:
    """The log's records as `wandb_internal_pb2.Record` messages, read once."""
    from wandb.proto import wandb_internal_pb2

    records = []
    for number, raw in enumerate(raw_records(path)):
        record = wandb_internal_pb2.Record()
        try:
            record.ParseFromString(raw)
        except Exception as err:  # protobuf's DecodeError
            raise DamagedFile(f"{path}: damaged W&B log: record {number}: {err}") from None
        records.append(record)
    return records


def _has_exit(records: list) -> bool:
    return any(r.WhichOneof("record_type") == "exit" for r in records)


def complete_records(path: Path, timeout: float = 60.0) -> list:
    """The log's records once its exit record is there, waiting up to `timeout` seconds:
    wandb.finish() can return before the W&B service has flushed the offline log (seen under
    load in the test suite: an empty summary)."""
    deadline = time.monotonic() + timeout
    while True:
        records = read_records(path)
        if _has_exit(records):
            return records
        if time.monotonic() >= deadline:
            raise BertkitError(f"{path}: no exit record after {timeout} s")
        time.sleep(0.2)


def find_log(run_dir: Path) -> Path:
    """The one `run-*.wandb` file of a W&B run directory."""
    logs = sorted(Path(run_dir).glob("run-*.wandb"))
    if len(logs) != 1:
        found = ", ".join(p.name for p in logs) or "none"
        raise BertkitError(f"{run_dir}: expected one run-*.wandb file, found {found}")
    return logs[0]


def read_offline_run(run_dir: Path, wait_for_exit: float | None = None) -> dict:
    """What the run in run_dir logged: its config (after every update), final summary, the
    keys its history logged, tags, group, name, start time (seconds since the epoch, None
    without a run record) and exit code (None when the log has no exit record: a run still
    going, or killed). wait_for_exit: seconds to wait for the exit record (see
    complete_records); None reads the log once as it is."""
    path = find_log(run_dir)
    records = (read_records(path) if wait_for_exit is None
               else complete_records(path, wait_for_exit))
    result = {"path": path, "config": {}, "summary": {}, "history_keys": set(), "tags": [],
              "group": None, "name": None, "start_time": None, "exit_code": None,
              "has_run_record": False}
    for record in records:
        _apply(result, record, path)
    return result


def _apply(result: dict, record, path: Path) -> None:
    """One record's change to what read_offline_run returns; other records (output, stats,
    telemetry, ...) change nothing of it."""
    kind = record.WhichOneof("record_type")
    if kind == "run":
        run = record.run
        result.update(has_run_record=True, tags=list(run.tags), group=run.run_group,
                      name=run.display_name,
                      start_time=run.start_time.seconds + run.start_time.nanos / 1e9)
        _update(result["config"], run.config, path)
    elif kind == "config":
        _update(result["config"], record.config, path)
    elif kind == "summary":
        _update(result["summary"], record.summary, path)
    elif kind == "history":
        result["history_keys"].update("/".join(_keys(item)) for item in record.history.item)
    elif kind == "exit":
        result["exit_code"] = record.exit.exit_code


def _update(target: dict, change, path: Path) -> None:
    """A config or summary record's updates and removals applied to target. An item with a
    nested key (("a", "b"): run.summary["a"]["b"] = v) changes target["a"]["b"], as W&B's
    own files show it; a plain key is one key, "/" and all ("final/validation/f1")."""
    for item in change.update:
        *parents, last = _keys(item)
        node = target
        for key in parents:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        node[last] = _json(path, item)
    for item in change.remove:
        *parents, last = _keys(item)
        node = target
        for key in parents:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)


def _keys(item) -> list[str]:
    return list(item.nested_key) or [item.key]


def _json(path: Path, item):
    try:
        return json.loads(item.value_json)
    except json.JSONDecodeError as err:
        raise BertkitError(f"{path}: W&B value of {'/'.join(_keys(item))!r} is not JSON: "
                           f"{err}") from None


# `python -m bertkit.reporting.wandb_log PATH...`: an offline W&B run read on the command line
# (docs/reliability.md#what-a-run-keeps), without uploading it.

def run_folders(path: Path) -> list[Path]:
    """The W&B run folders at `path`: the folder itself (offline-run-* or run-*), or each
    one under a bertkit run directory's wandb/ (one per session of a resumed run)."""
    path = Path(path)
    if any(path.glob("run-*.wandb")):
        return [path]
    return sorted(folder for folder in (path / "wandb").glob("*run-*") if folder.is_dir()
                  and not folder.is_symlink())


def main(argv: list[str] | None = None) -> int:
    """Prints what each W&B run folder at the paths logged, one JSON object a line (jq reads
    them): name, group, tags, config, final summary, logged keys, exit code."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        prog="python -m bertkit.reporting.wandb_log",
        description="What a W&B run logged, read from its folder's run-*.wandb log (offline "
                    "runs too): a W&B run folder, or a bertkit run directory (its wandb/).")
    parser.add_argument("paths", nargs="+", type=Path)
    args = parser.parse_args(argv)
    folders = [folder for path in args.paths for folder in run_folders(path)]
    if not folders:
        print(f"no W&B run folder at {', '.join(map(str, args.paths))}", file=sys.stderr)
        return 2
    for folder in folders:
        try:
            run = read_offline_run(folder)
        except BertkitError as err:
            print(f"{folder}: {err}", file=sys.stderr)
            return 2
        shown = {"folder": str(folder), **{key: run[key] for key in (
            "name", "group", "tags", "exit_code", "summary", "config")},
                 "history_keys": sorted(run["history_keys"])}
        print(json.dumps(shown, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
