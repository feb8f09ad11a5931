"""Settings that used to fail late or silently get one clear message before any training: a
learning rate that is not positive, a task longer than the model's positions, resume=true
with no checkpoint; resume=auto starts when there is none and continues when there is."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import BertConfig, BertForSequenceClassification, TrainingArguments

from bertkit.errors import BertkitError
from bertkit.jobs import run_job
from bertkit.training.run import resume_checkpoint
from tests.conftest import compose_config, tiny_run_overrides


@pytest.mark.parametrize("rate", [0.0, -2e-5, 2e5])
def test_a_learning_rate_out_of_range_is_refused(rate, glue_dir, vocab_dir, tmp_path):
    cfg = compose_config(tiny_run_overrides("rte", glue_dir("rte"), vocab_dir,
                                            **{"trainer.learning_rate": rate}))
    with pytest.raises(BertkitError, match=rf"trainer.learning_rate={rate!r}: expected a "
                                           r"number > 0 and <= 1"):
        run_job(cfg, run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_task_longer_than_the_model_positions_is_refused(glue_dir, vocab_dir, tmp_path):
    cfg = compose_config(tiny_run_overrides("rte", glue_dir("rte"), vocab_dir,
                                            **{"model.config.max_position_embeddings": 64}))
    with pytest.raises(BertkitError, match=r"task.max_seq_length=128 exceeds the 64 positions "
                                           r"of model.config.max_position_embeddings"):
        run_job(cfg, run_dir=tmp_path / "run")


def test_a_checkpoint_with_fewer_positions_is_named(glue_dir, vocab_dir, tmp_path):
    checkpoint = tmp_path / "small-checkpoint"
    BertForSequenceClassification(BertConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=100)).save_pretrained(checkpoint)
    cfg = compose_config(tiny_run_overrides("rte", glue_dir("rte"), vocab_dir,
                                            **{"model.name_or_path": str(checkpoint)}))
    with pytest.raises(BertkitError, match=rf"task.max_seq_length=128 exceeds the 100 positions "
                                           rf"of model.name_or_path={checkpoint}"):
        run_job(cfg, run_dir=tmp_path / "run")


def test_resume_true_without_a_checkpoint_is_refused(glue_dir, vocab_dir, tmp_path):
    cfg = compose_config(tiny_run_overrides("rte", glue_dir("rte"), vocab_dir, resume=True,
                                            cache_dir=tmp_path / "cache"))
    with pytest.raises(BertkitError, match=r"resume=true but .*run/checkpoints holds no "
                                           r"checkpoint: give hydra.run.dir=<the run to "
                                           r"continue>, or resume=auto"):
        run_job(cfg, run_dir=tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.json").exists()
    # Refused before the run starts: no resolved config and no tokenised data either.
    assert not (tmp_path / "run" / "config.yaml").exists()
    assert not (tmp_path / "cache").exists()


@pytest.mark.slow  # a run
def test_resume_auto_starts_without_a_checkpoint(glue_dir, vocab_dir, tmp_path):
    run_job(compose_config(tiny_run_overrides("rte", glue_dir("rte"), vocab_dir,
                                              resume="auto")), run_dir=tmp_path / "run")
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["train"]["steps"] == 4


def whole_checkpoint(folder, state: str | None = "{}") -> None:
    """A checkpoint whose every file is whole (`state`: trainer_state.json's text; None: no
    such file)."""
    folder.mkdir()
    save_file({"w": torch.zeros(2)}, folder / "model.safetensors")
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        torch.save({}, folder / name)
    if state is not None:
        (folder / "trainer_state.json").write_text(state)


@pytest.mark.parametrize("resume", [True, "auto"])
def test_resume_picks_the_last_checkpoint(resume, tmp_path):
    for step in (2, 10, 4):
        whole_checkpoint(tmp_path / f"checkpoint-{step}")
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[])
    assert resume_checkpoint(resume, args) == str(tmp_path / "checkpoint-10")
    assert resume_checkpoint(False, args) is None
    with pytest.raises(BertkitError, match=r"resume='later': expected false, true or auto"):
        resume_checkpoint("later", args)


def test_resume_takes_the_newest_complete_checkpoint_and_names_the_torn_ones(tmp_path, caplog):
    for step, state in [(2, "{}"), (10, "{}"), (12, '{"global_st'), (14, None)]:
        whole_checkpoint(tmp_path / f"checkpoint-{step}", state)
    (tmp_path / "checkpoint-20").write_text("a file, not a checkpoint")
    (tmp_path / "checkpoint-30-tmp").mkdir()
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[])
    with caplog.at_level("WARNING"):
        assert resume_checkpoint("auto", args) == str(tmp_path / "checkpoint-10")
    assert ("checkpoint-14: no trainer_state.json (the save was cut short); checkpoint-12: "
            "trainer_state.json is cut short (not valid JSON)" in caplog.text)
    assert resume_checkpoint(True, args) == str(tmp_path / "checkpoint-10")


def test_resume_true_with_only_torn_checkpoints_names_them(tmp_path):
    whole_checkpoint(tmp_path / "checkpoint-4", '{"log_hist')
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[])
    with pytest.raises(BertkitError, match=r"holds only incomplete checkpoints \(checkpoint-4: "
                                           r"trainer_state.json is cut short"):
        resume_checkpoint(True, args)
    assert resume_checkpoint("auto", args) is None
