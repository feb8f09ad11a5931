"""Each checkpoint is fsynced once Trainer has saved it: every file, its folder and the folder
holding it (a real tiny run, the fsync calls recorded by the paths they flushed)."""

from __future__ import annotations

import os

import pytest

from bertkit.jobs import run_job
from tests.conftest import compose_config, tiny_run_overrides


def fsynced_paths(monkeypatch) -> list[str]:
    """Records the path of every fsync'd descriptor (then fsyncs it)."""
    synced, real_fsync = [], os.fsync

    def record(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", record)
    return synced


@pytest.mark.slow  # a checkpointed run
@pytest.mark.parametrize("enabled", [True, False])
def test_every_file_of_each_checkpoint_and_its_folders_are_fsynced(
        enabled, glue_dir, vocab_dir, tmp_path, monkeypatch):
    synced = fsynced_paths(monkeypatch)
    overrides = tiny_run_overrides("mrpc", glue_dir("mrpc", n_train=48), vocab_dir, **{
        "trainer.max_steps": 4, "trainer.save_strategy": "steps", "trainer.save_steps": 2,
        "trainer.save_total_limit": 3, "fsync_checkpoints": enabled, "keep_checkpoints": True})
    run_dir = tmp_path / "run"
    run_job(compose_config(overrides), run_dir=run_dir)
    checkpoints = run_dir / "checkpoints"
    for step in (2, 4):
        folder = checkpoints / f"checkpoint-{step}"
        files = sorted(str(path) for path in folder.iterdir())
        assert len(files) >= 6  # weights, optimizer, scheduler, RNG, state, ...
        expected = [*files, str(folder), str(checkpoints)]
        if enabled:
            assert set(expected) <= set(synced), set(expected) - set(synced)
        else:
            assert not set(files) & set(synced)


def test_a_file_renamed_away_while_the_checkpoint_is_walked_is_skipped(tmp_path, monkeypatch):
    """Under DDP every process fsyncs the checkpoint while the main process still renames its
    own files into it (a temporary file, then os.replace): a listed name that is gone is
    skipped, not an error that stops one process and leaves the others in a collective."""
    from bertkit.training import stop_and_resume as checkpoints

    folder = tmp_path / "checkpoint-2"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / ".clock.json.tmp").write_text("{}")
    real_walk = os.walk

    def walk_then_rename(top, topdown=True):
        for root, dirs, names in real_walk(top, topdown=topdown):
            if (folder / ".clock.json.tmp").exists():  # renamed after the listing
                os.replace(folder / ".clock.json.tmp", folder / "clock.json")
            yield root, dirs, names

    monkeypatch.setattr(checkpoints.os, "walk", walk_then_rename)
    assert checkpoints.fsync_tree(folder) == 1  # model.safetensors; the temporary file is gone
    assert checkpoints.fsync_path(folder / "gone") is False
