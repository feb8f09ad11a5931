"""A full disk while a run saves (a real one: tests.small_disk) ends in one line naming the
file, what was being saved and the space left; the previous checkpoint is whole and resumes,
and what the failed save wrote is removed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from transformers import BertConfig, BertForSequenceClassification

from bertkit.errors import BertkitError
from bertkit.jobs import run_job
from bertkit.training.stop_and_resume import DurableCheckpoints, scan_checkpoints
from bertkit.training.trainer import BertkitTrainer
from tests.conftest import compose_config, tiny_run_overrides
from tests.small_disk import TMPFS, disk_kinds, small_disk


@pytest.mark.slow
@pytest.mark.parametrize("kind", disk_kinds())
def test_a_full_disk_during_a_save_is_one_line_and_the_previous_checkpoint_resumes(
        glue_dir, vocab_dir, tmp_path, monkeypatch, kind):
    """The disk fills once checkpoint-2 is saved, leaving half of what it took: checkpoint-4's
    optimizer.pt does not fit (torch's writer: "unexpected pos", no errno)."""
    overrides = tiny_run_overrides("mrpc", glue_dir("mrpc", n_train=48), vocab_dir, **{
        "trainer.max_steps": 8, "trainer.save_strategy": "steps", "trainer.save_steps": 2})
    real_on_save = DurableCheckpoints.on_save
    with small_disk(tmp_path, kind) as disk:
        def fill_after_the_first_save(self, args, state, control, **kwargs):
            done = real_on_save(self, args, state, control, **kwargs)
            if state.global_step == 2:
                first = Path(args.output_dir) / "checkpoint-2"
                disk.fill(leave=sum(file.stat().st_size for file in first.iterdir()) // 2)
            return done

        monkeypatch.setattr(DurableCheckpoints, "on_save", fill_after_the_first_save)
        run_dir = disk.path / "run"
        checkpoints = run_dir / "checkpoints"
        with pytest.raises(BertkitError) as raised:
            run_job(compose_config(overrides), run_dir=run_dir)
        message = str(raised.value)
        assert re.fullmatch(
            rf"(no space left on device|torch's writer failed .*) while writing "
            rf"{checkpoints}/checkpoint-4/optimizer.pt \(checkpoint-4, removed; "
            rf"[0-9.]+ [KMG]?i?B of [0-9.]+ [KMG]?i?B free there\); the last complete "
            rf"checkpoint, {checkpoints}/checkpoint-2, is intact: free some space and run "
            rf"the same command with resume=auto", message), message
        if kind == TMPFS:
            assert message.startswith("no space left on device")
        # Nothing half written is left: checkpoint-2 is whole, checkpoint-4 gone.
        scan = scan_checkpoints(checkpoints)
        assert scan.complete == checkpoints / "checkpoint-2" and scan.skipped == []
        assert not any(name.startswith(("checkpoints/checkpoint-4", "model"))
                       or name.endswith(".tmp") for name in disk.files()), disk.files()

        disk.free_again()
        monkeypatch.setattr(DurableCheckpoints, "on_save", real_on_save)
        calls = {"n": 0}
        original_step = BertkitTrainer.training_step

        def count(self, *args, **kwargs):
            calls["n"] += 1
            return original_step(self, *args, **kwargs)

        monkeypatch.setattr(BertkitTrainer, "training_step", count)
        run_job(compose_config(overrides + ["resume=auto"]), run_dir=run_dir)
        assert calls["n"] == 6  # from checkpoint-2: steps 3..8
        assert (run_dir / "metrics.json").is_file()


@pytest.mark.parametrize("kind", disk_kinds())
def test_a_model_saved_on_a_full_disk_is_one_line_and_leaves_no_folder(tmp_path, kind):
    from bertkit.training.run import saving_model  # here: the other tests run without it

    model = BertForSequenceClassification(BertConfig(
        vocab_size=500, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64))
    with small_disk(tmp_path, kind) as disk:
        model_dir = disk.path / "run" / "model"
        disk.fill(leave=4096)  # the weights take some 100 KiB
        with pytest.raises(BertkitError) as raised:
            with saving_model(model_dir, main=True):
                model.save_pretrained(str(model_dir))  # safetensors: SafetensorError
        message = str(raised.value)
        assert "\n" not in message
        assert re.fullmatch(
            rf"(no space left on device|file too large .*) while writing {model_dir}/\S+ "
            rf"\(the trained model, removed; [0-9.]+ [KMG]?i?B of [0-9.]+ [KMG]?i?B free "
            rf"there\); free some space and run the same command with resume=auto",
            message), message
        assert not model_dir.exists()
