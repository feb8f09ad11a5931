"""A result file or a cache entry written on a full disk (a real one: tests.small_disk) ends in
one line naming the file, what it is and the space left; the previous result file is as it
was, and no half-written file or temporary file is left behind."""

from __future__ import annotations

import json
import re

import datasets
import pytest

from bertkit.data import atomic_files
from bertkit.data.cache import cached_build, cached_map
from bertkit.errors import BertkitError
from tests.small_disk import TMPFS, disk_kinds, small_disk

LEAVE = 4096  # bytes left on the full disk: less than what each test writes
BIG = "x" * (16 * LEAVE)
# Every result-file writer of bertkit.data.atomic_files, with what each writes too big to fit.
WRITERS = {
    "write_text_atomic": lambda path: atomic_files.write_text_atomic(path, BIG),
    "write_yaml_atomic": lambda path: atomic_files.write_yaml_atomic(path, f"key: {BIG}"),
    "write_json_atomic": lambda path: atomic_files.write_json_atomic(path, {"key": BIG}),
    "write_tsv_atomic": lambda path: atomic_files.write_tsv_atomic(path, ["key"], [[BIG]]),
}
FREE = r"[0-9.]+ [KMG]?i?B of [0-9.]+ [KMG]?i?B free there"


def test_the_writers_listed_are_every_writer():
    assert sorted(WRITERS) == sorted(name for name in dir(atomic_files)
                                     if name.startswith("write_") and name.endswith("_atomic"))


def assert_one_line_naming(message: str, kind: str, file, what: str) -> None:
    assert "\n" not in message
    reason = "no space left on device" if kind == TMPFS else r"file too large \(over the " \
        r"file-size limit: see `ulimit -f`\)"
    assert re.match(rf"{reason} while writing {re.escape(str(file))} \({what}; {FREE}\)",
                    message), message


@pytest.mark.parametrize("kind", disk_kinds())
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_result_file_on_a_full_disk_is_one_line_and_the_previous_one_is_whole(
        tmp_path, kind, writer):
    with small_disk(tmp_path, kind) as disk:
        result = disk.path / "run" / "metrics.json"
        atomic_files.write_json_atomic(result, {"main_value": 0.5})
        disk.fill(leave=LEAVE)
        with pytest.raises(BertkitError) as raised:
            WRITERS[writer](result)
        assert_one_line_naming(str(raised.value), kind, result, "a result file")
        assert str(raised.value).endswith("; metrics.json is as it was before")
        assert json.loads(result.read_text()) == {"main_value": 0.5}
        assert disk.files() == ["run/metrics.json"]  # no temporary file left


def _table() -> datasets.Dataset:
    return datasets.Dataset.from_dict({"text": [f"{BIG} {i}" for i in range(4)]})


def _double(batch: dict) -> dict:
    return {"twice": [text * 2 for text in batch["text"]]}


CACHE_WRITES = {
    "cached_map": (lambda entry: cached_map(_table(), _double, entry, "train"),
                   "train.arrow", "the cache entry of tokenised train"),
    "cached_build": (lambda entry: cached_build(entry, "features", lambda: (_table(), {})),
                     "features", "the cache entry of features"),
}


@pytest.mark.parametrize("kind", disk_kinds())
@pytest.mark.parametrize("write", sorted(CACHE_WRITES))
def test_a_cache_entry_on_a_full_disk_is_one_line_and_leaves_no_partial_file(
        tmp_path, kind, write):
    datasets.disable_progress_bars()
    build, item, what = CACHE_WRITES[write]
    with small_disk(tmp_path, kind) as disk:
        entry = disk.path / "cache" / "glue" / "key"
        entry.mkdir(parents=True)
        disk.fill(leave=LEAVE)
        with pytest.raises(BertkitError) as raised:
            build(entry)
        assert_one_line_naming(str(raised.value), kind, entry / item, what)
        assert "set cache_dir (BERTKIT_CACHE)" in str(raised.value)
        # The lock files alone: no item, no datasets temporary file, no staging folder.
        assert all(re.fullmatch(r"cache/glue/key/\.\w+\.lock", name)
                   for name in disk.files()), disk.files()
        disk.free_again()
        assert len(build(entry) if write == "cached_map" else build(entry)[0]) == 4


@pytest.mark.parametrize("kind", disk_kinds())
def test_a_sweep_job_whose_failed_json_does_not_fit_still_tells_its_own_error(
        tmp_path, kind, caplog):
    """A sweep job that failed on a full disk cannot write failed.json either: the log says
    both, and the job's own error is not hidden behind the refused write."""
    from hydra.conf import HydraConf
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from bertkit.cli import record_failed_job

    with small_disk(tmp_path, kind) as disk:
        hydra = OmegaConf.structured(HydraConf)
        hydra.runtime.output_dir, hydra.job.num = str(disk.path), 3
        hydra.overrides.task = ["seed=1"]
        HydraConfig.instance().set_config(OmegaConf.create({"hydra": hydra}))
        disk.fill(leave=16)
        try:
            record_failed_job(BertkitError("task.data_dir: no such directory /x"))
        finally:
            disk.free_again()
            HydraConfig.instance().cfg = None
        assert disk.files() == []
    lines = [record.getMessage() for record in caplog.records]
    assert any(line.startswith("job 3: ") and "failed.json" in line for line in lines), lines
    assert "job 3 failed: task.data_dir: no such directory /x" in lines
