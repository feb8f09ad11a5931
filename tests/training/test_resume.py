"""An interrupted finetune resumes from its last checkpoint and ends where an uninterrupted
run with the same seed ends."""

from __future__ import annotations

import json
import shutil
from fnmatch import fnmatch
from pathlib import Path

import pytest
from safetensors.torch import load_file
from transformers.trainer import (
    OPTIMIZER_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    TRAINER_STATE_NAME,
)
from transformers.trainer_utils import speed_metrics
from transformers.utils import SAFE_WEIGHTS_NAME

from bertkit.jobs import run_job
from bertkit.pretraining.heldout import ELAPSED
from bertkit.pretraining.heldout import PREFIX as HELDOUT_PREFIX
from bertkit.training.stop_and_resume import RNG_PATTERN, file_fault, scan_checkpoints
from bertkit.training.throughput import PREFIX as THROUGHPUT_PREFIX
from bertkit.training.trainer import BertkitTrainer
from tests.conftest import compose_config, tiny_run_overrides
from tests.pretraining.test_pretrain_recipe import tiny_pretraining_overrides


class Interrupted(Exception):
    pass


def interrupted_run(overrides, run_dir, monkeypatch, at_step: int) -> dict:
    """Runs until step `at_step` starts and raises there; returns the step counter, which
    the test resets to count the resumed run's steps (no more interruptions then)."""
    original_step = BertkitTrainer.training_step
    calls = {"n": 0}

    def interrupt(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == at_step:
            raise Interrupted
        return original_step(self, *args, **kwargs)

    monkeypatch.setattr(BertkitTrainer, "training_step", interrupt)
    with pytest.raises(Interrupted):
        run_job(compose_config(overrides), run_dir=run_dir)
    assert not (run_dir / "metrics.json").exists()
    return calls


def assert_same_weights(run_dir, reference_dir) -> None:
    resumed = load_file(run_dir / "model" / "model.safetensors")
    reference = load_file(reference_dir / "model" / "model.safetensors")
    for name, tensor in reference.items():
        assert resumed[name].allclose(tensor, atol=1e-5), name


def checkpointed_run(glue_dir, vocab_dir, tmp_path, save_total_limit: int):
    """8 steps of MRPC saved every 2, and the uninterrupted run's directory."""
    overrides = tiny_run_overrides("mrpc", glue_dir("mrpc", n_train=48), vocab_dir, **{
        "trainer.max_steps": 8, "trainer.save_strategy": "steps", "trainer.save_steps": 2,
        "trainer.save_total_limit": save_total_limit, "keep_checkpoints": True})
    reference_dir = tmp_path / "reference"
    run_job(compose_config(overrides), run_dir=reference_dir)
    return overrides, reference_dir


@pytest.mark.slow
def test_resume_continues_an_interrupted_run(glue_dir, vocab_dir, tmp_path, monkeypatch):
    overrides, reference_dir = checkpointed_run(glue_dir, vocab_dir, tmp_path, 2)
    run_dir = tmp_path / "run"
    calls = interrupted_run(overrides, run_dir, monkeypatch, at_step=6)
    assert (run_dir / "checkpoints" / "checkpoint-4").is_dir()

    calls["n"] = -100  # no more interruptions; count the steps the resumed run takes
    run_job(compose_config(overrides + ["resume=true"]), run_dir=run_dir)
    assert calls["n"] == -100 + 4  # steps 5..8 only
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["train"]["steps"] == 8
    assert_same_weights(run_dir, reference_dir)


# What the resume reads of a checkpoint, by transformers' own names (and the RNG states,
# rng_state.pth or one per process); the cases below are the files a real checkpoint holds.
RESUME_READS = (TRAINER_STATE_NAME, OPTIMIZER_NAME, SCHEDULER_NAME, SCALER_NAME,
                SAFE_WEIGHTS_NAME)


def read_by_resume(path: Path) -> bool:
    return path.name in RESUME_READS or fnmatch(path.name, RNG_PATTERN)


def cut(path: Path) -> None:
    """What an unsynced write leaves after a crash: the first half of the file."""
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.fixture
def torn_run(glue_dir, vocab_dir, tmp_path, monkeypatch):
    """A real run interrupted at step 7 with checkpoints 2, 4 and 6, the uninterrupted run's
    directory, and the step counter (see interrupted_run)."""
    overrides, reference_dir = checkpointed_run(glue_dir, vocab_dir, tmp_path, 3)
    run_dir = tmp_path / "interrupted"
    calls = interrupted_run(overrides, run_dir, monkeypatch, at_step=7)
    return overrides, reference_dir, run_dir, calls


@pytest.mark.slow
def test_a_cut_in_any_file_of_the_newest_checkpoint_makes_it_skipped_naming_the_file(
        torn_run):
    _, _, run_dir, _ = torn_run
    checkpoints = run_dir / "checkpoints"
    newest = checkpoints / "checkpoint-6"
    files = sorted(path for path in newest.iterdir() if path.is_file())
    assert {path.name for path in files if read_by_resume(path)} >= {
        TRAINER_STATE_NAME, OPTIMIZER_NAME, SCHEDULER_NAME, SAFE_WEIGHTS_NAME, "rng_state.pth"}
    assert scan_checkpoints(checkpoints).complete == newest
    checked = []
    for path in files:
        whole = path.read_bytes()
        cut(path)
        scan = scan_checkpoints(checkpoints)
        if file_fault(path) is not None:  # a kind whose content is checked
            checked.append(path.name)
            assert scan.complete == checkpoints / "checkpoint-4", path.name
            assert scan.describe_skipped().startswith(
                f"checkpoint-6: {path.name} is cut short"), scan.describe_skipped()
        path.unlink()  # and a file that never reached the disk at all
        scan = scan_checkpoints(checkpoints)
        if read_by_resume(path):
            assert scan.complete == checkpoints / "checkpoint-4", path.name
            assert "(the save was cut short)" in scan.describe_skipped()
            assert path.name.split(".")[0] in scan.describe_skipped()
        path.write_bytes(whole)
        assert scan_checkpoints(checkpoints).complete == newest
    # Every file the resume reads is checked by content (and here every other one too: the
    # tokenizer's and the model's JSON, training_args.bin, the training clock).
    assert {path.name for path in files if read_by_resume(path)} <= set(checked)
    assert set(checked) == {path.name for path in files}


@pytest.mark.slow
def test_resume_auto_skips_a_checkpoint_with_any_file_the_resume_reads_cut(
        torn_run, tmp_path, caplog):
    """For each file of the newest checkpoint that Trainer's resume reads, cut in a copy of
    the run: resume=auto continues from checkpoint-4, says why naming the file, and ends
    where the uninterrupted run ends."""
    overrides, reference_dir, interrupted, calls = torn_run
    cases = sorted(path.name for path in (interrupted / "checkpoints" / "checkpoint-6").iterdir()
                   if read_by_resume(path))
    assert len(cases) >= 5
    for name in cases:
        run_dir = tmp_path / f"torn-{name}"
        shutil.copytree(interrupted, run_dir)
        cut(run_dir / "checkpoints" / "checkpoint-6" / name)
        calls["n"] = -100
        caplog.clear()
        with caplog.at_level("WARNING"):
            run_job(compose_config(overrides + ["resume=auto"]), run_dir=run_dir)
        assert calls["n"] == -100 + 4, name  # from checkpoint-4: steps 5..8
        assert f"checkpoint-6: {name} is cut short" in caplog.text, name
        assert_same_weights(run_dir, reference_dir)
        # The resumed run wrote step 6 again, whole.
        assert scan_checkpoints(run_dir / "checkpoints").complete.name == "checkpoint-8"
        assert file_fault(run_dir / "checkpoints" / "checkpoint-6" / name) is None


# A run killed between two checkpoints and resumed records what the uninterrupted run records.

# The record's fields that measure time or throughput, as their writers name them: the train
# record's seconds, training_seconds and throughput (bertkit.training.run.TrainingRun
# .train_record), the pretraining record's data.preprocessing_seconds
# (bertkit.pretraining.run); in a log line Trainer's speed metrics (speed_metrics), the
# throughput meter's window (bertkit.training.throughput.PREFIX) and the training time of a
# held-out evaluation (bertkit.pretraining.heldout.ELAPSED).
TIME_FIELDS = ("train.seconds", "train.training_seconds", "train.throughput",
               "data.preprocessing_seconds")
SPEED_KEYS = tuple(speed_metrics("train", 0.0, num_samples=1, num_steps=1, num_tokens=1))


def measures_time(key: str) -> bool:
    return (key in SPEED_KEYS or key.startswith(THROUGHPUT_PREFIX)
            or key.removeprefix(HELDOUT_PREFIX) == ELAPSED)


def untimed(record, path: str = ""):
    """`record` without the fields that measure time (TIME_FIELDS, SPEED_KEYS)."""
    if isinstance(record, dict):
        return {key: untimed(value, f"{path}.{key}" if path else key)
                for key, value in record.items()
                if (f"{path}.{key}" if path else key) not in TIME_FIELDS
                and not measures_time(key)}
    if isinstance(record, list):
        return [untimed(value, path) for value in record]
    return record


def holds(record: dict, field: str) -> bool:
    for key in field.split("."):
        if not isinstance(record, dict) or key not in record:
            return False
        record = record[key]
    return True


def leaves(record, path: str = "") -> dict:
    """Every recorded value by its dotted path, to name the field that differs."""
    if isinstance(record, dict):
        return {key: value for name, child in record.items()
                for key, value in leaves(child, f"{path}.{name}" if path else name).items()}
    if isinstance(record, list):
        return {key: value for i, child in enumerate(record)
                for key, value in leaves(child, f"{path}[{i}]").items()}
    return {path: record}


def killed_run_overrides(kind: str, glue_dir, vocab_dir, cache_dir: Path) -> list[str]:
    """6 steps, a checkpoint every 2 and a log line every 3: each checkpoint but the last
    lies inside a logging window, which a resume from it splits."""
    steps = {"trainer.max_steps": 6, "trainer.save_strategy": "steps", "trainer.save_steps": 2,
             "trainer.save_total_limit": 3, "trainer.logging_steps": 3,
             "cache_dir": cache_dir}
    if kind == "pretrain":
        # Held-out scores every 2 steps: by the clock (every_seconds) the steps scored would
        # depend on the machine's speed.
        return tiny_pretraining_overrides(**{
            **steps, "model.config.hidden_size": 32, "model.config.intermediate_size": 64,
            "trainer.per_device_train_batch_size": 8, "heldout.every_seconds": "null",
            "heldout.every_steps": 2})
    return tiny_run_overrides("mrpc", glue_dir("mrpc", n_train=48), vocab_dir, **steps)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["finetune", "pretrain"])
def test_a_run_killed_between_checkpoints_then_resumed_records_the_uninterrupted_record(
        kind, glue_dir, vocab_dir, tmp_path, monkeypatch):
    """Killed by an exception as step 4 begins (checkpoint-2 saved, checkpoint-4 not yet),
    then resume=auto: metrics.json equals the uninterrupted run's in every field that does not
    measure time, the training loss over all 6 steps and every log line included."""
    overrides = killed_run_overrides(kind, glue_dir, vocab_dir, tmp_path / "cache")
    reference_dir, run_dir = tmp_path / "reference", tmp_path / "run"
    run_job(compose_config(overrides), run_dir=reference_dir)
    calls = interrupted_run(overrides, run_dir, monkeypatch, at_step=4)
    assert scan_checkpoints(run_dir / "checkpoints").complete.name == "checkpoint-2"
    calls["n"] = -100
    run_job(compose_config(overrides + ["resume=auto"]), run_dir=run_dir)
    assert calls["n"] == -100 + 4  # steps 3..6
    reference = json.loads((reference_dir / "metrics.json").read_text())
    resumed = json.loads((run_dir / "metrics.json").read_text())
    # The fields left out are the writers' (a renamed one would fail here, not pass unseen).
    assert {"train.seconds", "train.training_seconds"} <= {
        field for field in TIME_FIELDS if holds(reference, field)}
    # Paths are compared inside their run directory.
    expected = {key: value.replace(str(reference_dir), "<run>") if isinstance(value, str)
                else value for key, value in leaves(untimed(reference)).items()}
    found = {key: value.replace(str(run_dir), "<run>") if isinstance(value, str) else value
             for key, value in leaves(untimed(resumed)).items()}
    differing = {key: (expected.get(key), found.get(key)) for key in expected.keys() | found
                 if expected.get(key) != found.get(key)}
    assert differing == {}
    assert resumed["train"]["steps"] == 6
