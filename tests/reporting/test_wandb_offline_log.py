"""bertkit's reader of W&B transaction logs on real offline runs: records across 32 KiB
blocks, nested summary keys and removals, a log cut short while being written, a damaged log,
a file that is no log or a log of an unknown version."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from bertkit.errors import BertkitError
from bertkit.reporting.wandb_log import BLOCK, find_log, raw_records, read_offline_run
from tests.wandb_records import complete_records


def offline_run(directory: Path, config: dict, summary: dict, exit_code: int = 0) -> Path:
    """A real W&B offline run opened in `directory` as bertkit opens one (wandb.init(dir=...)),
    with `summary` set as finish_wandb sets it; returns its W&B run directory once the log's
    exit record is written."""
    import wandb

    directory.mkdir(parents=True, exist_ok=True)
    run = wandb.init(project="bertkit-test", dir=str(directory), mode="offline", config=config,
                     reinit="finish_previous")
    for key, value in summary.items():
        run.summary[key] = value
    run.finish(exit_code=exit_code)
    (run_dir,) = (directory / "wandb").glob(f"offline-run-*-{run.id}")
    complete_records(find_log(run_dir))
    return run_dir


def test_records_longer_than_a_block_and_every_value_read_back(tmp_path):
    blob = "".join(chr(97 + i % 26) for i in range(3 * BLOCK))  # spans four blocks
    run_dir = offline_run(tmp_path / "job", {"learning_rate": 2e-5, "blob": blob,
                                             "bertkit": {"task": {"name": "rte"}}},
                          {"final/validation/accuracy": 0.6875, "main_value": 0.6875,
                           "train/complete": False}, exit_code=0)
    log = read_offline_run(run_dir)
    assert log["config"]["blob"] == blob
    assert log["config"]["learning_rate"] == 2e-5
    assert log["config"]["bertkit"] == {"task": {"name": "rte"}}
    assert log["summary"]["final/validation/accuracy"] == 0.6875
    assert log["summary"]["train/complete"] is False
    assert log["exit_code"] == 0 and log["has_run_record"]
    assert log["path"].stat().st_size > 3 * BLOCK


def test_nested_summary_keys_and_removals(tmp_path):
    """run.summary["a"]["b"] = v is logged under the nested key ("a", "b"): it is read into
    summary["a"]["b"], as W&B shows it, not as a flat "a/b" beside a real flat key; a removed
    key is gone."""
    import wandb

    run = wandb.init(project="bertkit-test", dir=str(tmp_path), mode="offline",
                     config={"bertkit": {"task": {"name": "rte"}}}, reinit="finish_previous")
    run.summary["scores"] = {"f1": 0.5}
    run.summary["scores"]["em"] = 0.25
    run.summary["final/validation/f1"] = 0.75
    run.summary["gone"] = 1
    del run.summary["gone"]
    run.config.update({"seed": 3})
    run.finish()
    (run_dir,) = (tmp_path / "wandb").glob(f"offline-run-*-{run.id}")
    complete_records(find_log(run_dir))
    log = read_offline_run(run_dir)
    assert log["summary"]["scores"] == {"f1": 0.5, "em": 0.25}
    assert log["summary"]["final/validation/f1"] == 0.75
    assert "scores/em" not in log["summary"] and "gone" not in log["summary"]
    assert log["config"]["bertkit"] == {"task": {"name": "rte"}} and log["config"]["seed"] == 3


def test_exit_code_and_a_log_cut_short(tmp_path):
    run_dir = offline_run(tmp_path / "job", {"seed": 1}, {"main_value": 0.5}, exit_code=3)
    assert read_offline_run(run_dir)["exit_code"] == 3
    # The same log as a reader finds it while the run is still being written: its last
    # record (the exit) torn. It is dropped, the rest is read.
    path = find_log(run_dir)
    whole = len(raw_records(path))
    path.write_bytes(path.read_bytes()[:-1])
    log = read_offline_run(run_dir)
    assert log["exit_code"] is None
    assert log["summary"]["main_value"] == 0.5 and log["config"]["seed"] == 1
    assert len(raw_records(path)) == whole - 1


def test_damaged_and_foreign_files_name_the_file(tmp_path):
    run_dir = offline_run(tmp_path / "job", {"seed": 1}, {"main_value": 0.5})
    path = find_log(run_dir)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(BertkitError, match=rf"{path.name}: damaged W&B log: checksum mismatch"):
        read_offline_run(run_dir)
    path.write_bytes(b'{"not": "a log"}')
    with pytest.raises(BertkitError, match=rf"{path.name}: not a W&B transaction log"):
        read_offline_run(run_dir)
    path.write_bytes(b"")  # created, header not written yet: no log either
    with pytest.raises(BertkitError, match=rf"{path.name}: not a W&B transaction log"):
        read_offline_run(run_dir)
    (run_dir / "run-other.wandb").write_bytes(b"")
    with pytest.raises(BertkitError, match="expected one run-\\*.wandb file"):
        read_offline_run(run_dir)


def test_a_log_of_an_unknown_version_is_refused(tmp_path):
    """The header's magic and version, as W&B's own reader checked them: a log whose format
    bertkit does not know is named, not misread."""
    run_dir = offline_run(tmp_path / "job", {"seed": 1}, {"main_value": 0.5})
    path = find_log(run_dir)
    data = path.read_bytes()
    for magic, version in ((0xBEE2, 0), (0xBEE1, 1)):
        path.write_bytes(data[:4] + struct.pack("<HB", magic, version) + data[7:])
        with pytest.raises(BertkitError, match=rf"{path.name}: not a W&B transaction log of a "
                                               rf"known version \(magic {magic:#06x}, "
                                               rf"version {version}"):
            read_offline_run(run_dir)
    path.write_bytes(data)
    assert read_offline_run(run_dir)["summary"]["main_value"] == 0.5
