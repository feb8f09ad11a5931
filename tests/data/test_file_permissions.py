"""Result files follow the umask, as any file a program writes: under the usual 022 a
cluster group can read a colleague's metrics, configs, predictions, cards and reports."""

from __future__ import annotations

import os
import stat
from contextlib import contextmanager
from pathlib import Path

import pytest

from bertkit.data import atomic_files
from bertkit.jobs import run_job
from bertkit.reporting.cli import main as report_main
from tests.conftest import compose_config, tiny_run_overrides


@contextmanager
def umask(mask: int):
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# Every writer of atomic_files, each a call that writes `path`.
WRITERS = {
    "write_text_atomic": lambda path: atomic_files.write_text_atomic(path, "x\n"),
    "write_json_atomic": lambda path: atomic_files.write_json_atomic(path, {"a": 1}),
    "write_tsv_atomic": lambda path: atomic_files.write_tsv_atomic(path, ["a"], [[1]]),
    "write_yaml_atomic": lambda path: atomic_files.write_yaml_atomic(path, "a: 1\n"),
    "atomic_file (binary)": lambda path: _write_binary(path),
}


def _write_binary(path: Path) -> None:
    with atomic_files.atomic_file(path, "wb") as handle:
        handle.write(b"\x89PNG")


def test_every_writer_is_listed():
    public = {name for name in dir(atomic_files) if name.startswith("write_")}
    assert public == {name for name in WRITERS if name.startswith("write_")}


@pytest.mark.parametrize("name", sorted(WRITERS))
@pytest.mark.parametrize(("mask", "expected"), [(0o022, 0o644), (0o077, 0o600),
                                                (0o002, 0o664)])
def test_writers_follow_the_umask(name, mask, expected, tmp_path):
    path = tmp_path / "out" / "result"
    with umask(mask):
        WRITERS[name](path)
        WRITERS[name](path)  # replacing a file: the new one follows the umask too
    assert mode(path) == expected
    assert [p.name for p in path.parent.iterdir()] == ["result"]  # no temporary file left


def test_a_run_and_its_report_are_readable_by_the_group(glue_dir, vocab_dir, tmp_path):
    """Every file a finetune and bertkit-report leave, walked from disk (not a list of
    names): none is readable by its owner alone."""
    data = glue_dir("mrpc", n_train=16, n_dev=8, n_test=4)
    run_dir = tmp_path / "outputs" / "run"
    saving = {"trainer.max_steps": 2, "trainer.save_strategy": "steps", "trainer.save_steps": 2,
              "keep_checkpoints": True}
    with umask(0o022):
        run_job(compose_config(tiny_run_overrides("mrpc", data, vocab_dir, **saving)),
                run_dir=run_dir)
        assert report_main([str(tmp_path / "outputs"), "--out", str(tmp_path / "report"),
                            "--reference", "none"]) == 0
    files = [p for root in (run_dir, tmp_path / "report") for p in root.rglob("*")
             if p.is_file()]
    kinds = {p.name for p in files}
    assert {"metrics.json", "config.yaml", "report.md", "report.json", "results.csv",
            "README.md"} <= kinds
    assert any(p.suffix == ".png" for p in files) and any(p.suffix == ".tsv" for p in files)
    weights = [p for p in files if p.suffix == ".safetensors"]
    assert {p.parent.name for p in weights} == {"model", "checkpoint-2"}
    unreadable = [str(p.relative_to(tmp_path)) for p in files if not mode(p) & stat.S_IRGRP]
    assert unreadable == []
