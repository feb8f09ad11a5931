"""Read back what a W&B offline run stored in its `.wandb` file.

Why by hand: wandb >= 0.2x dropped its Python reader of the transaction log. The file is
":W&B" + magic + version, then a LevelDB-style log (32 KiB blocks; records with a 7-byte
header: crc32, little-endian length, type FULL/FIRST/MIDDLE/LAST) of protobuf Records.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

from wandb.proto import wandb_internal_pb2

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def raw_records(path: Path) -> list[bytes]:
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    pos, records, pending = 7, [], b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0:  # zero padding up to the end of the block
            pos += left
            continue
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind == FULL:
            records.append(chunk)
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            records.append(pending + chunk)
    return records


def complete_records(path: Path, timeout: float = 60.0) -> list:
    """The log's records once its exit record is there. wandb.finish() can return before the
    W&B service has flushed the offline log (seen under load in the full suite: an empty
    summary), so wait for the record that closes the run rather than read a partial file."""
    deadline = time.monotonic() + timeout
    while True:
        records = []
        for raw in raw_records(path):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(raw)
            records.append(record)
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        assert time.monotonic() < deadline, f"{path}: no exit record after {timeout} s"
        time.sleep(0.2)


def read_offline_run(run_dir: Path) -> dict:
    """The run's config (after every update), its tags, group, name and final summary."""
    (path,) = Path(run_dir).glob("run-*.wandb")
    result = {"config": {}, "summary": {}, "history_keys": set(), "tags": [], "group": None}
    for record in complete_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            result["tags"] = list(record.run.tags)
            result["group"] = record.run.run_group
            result["name"] = record.run.display_name
            items = record.run.config.update
        elif kind == "config":
            items = record.config.update
        elif kind == "summary":
            for item in record.summary.update:
                result["summary"][item.key or "/".join(item.nested_key)] = json.loads(
                    item.value_json)
            continue
        elif kind == "history":
            result["history_keys"].update(item.key or "/".join(item.nested_key)
                                         for item in record.history.item)
            continue
        else:
            continue
        for item in items:
            result["config"][item.key] = json.loads(item.value_json)
    return result
