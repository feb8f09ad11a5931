"""The finetuning methods compose with resume (and so with successive halving, which stops
runs part-way and resumes the survivors): an interrupted run with layer-wise rates, gradual
unfreezing and the layer mix ends where the uninterrupted one ends; so does a LoRA run."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from bertkit.jobs import run_job
from bertkit.training.trainer import BertkitTrainer
from tests.conftest import compose_config, tiny_run_overrides


class Interrupted(Exception):
    pass


@pytest.mark.slow
@pytest.mark.parametrize("methods", [
    {"finetuning": "llrd", "finetuning.unfreeze_every": 3, "finetuning.layer_mix": True},
    {"finetuning": "lora"},
], ids=["llrd+unfreezing+mix", "lora"])
def test_an_interrupted_run_resumes_to_the_uninterrupted_result(methods, glue_dir, vocab_dir,
                                                               tmp_path, monkeypatch):
    overrides = tiny_run_overrides("mrpc", glue_dir("mrpc", n_train=48), vocab_dir, **{
        "trainer.max_steps": 8, "trainer.save_strategy": "steps", "trainer.save_steps": 2,
        "trainer.save_total_limit": 2, **methods})
    reference = run_job(compose_config(overrides), run_dir=tmp_path / "reference")

    original_step = BertkitTrainer.training_step
    calls = {"n": 0}

    def interrupt_in_step_five(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:
            raise Interrupted
        return original_step(self, *args, **kwargs)

    monkeypatch.setattr(BertkitTrainer, "training_step", interrupt_in_step_five)
    run_dir = tmp_path / "run"
    with pytest.raises(Interrupted):
        run_job(compose_config(overrides), run_dir=run_dir)
    calls["n"] = -100
    resumed = run_job(compose_config(overrides + ["resume=true"]), run_dir=run_dir)
    assert calls["n"] == -100 + 4  # steps 5..8 only
    assert resumed["train"]["steps"] == 8
    assert json.loads((run_dir / "metrics.json").read_text())["main_value"] == \
        pytest.approx(reference["main_value"])
    ours = load_file(run_dir / "model" / "model.safetensors")
    theirs = load_file(tmp_path / "reference" / "model" / "model.safetensors")
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert ours[name].allclose(tensor, atol=1e-5), name
    if "finetuning.unfreeze_every" in methods:
        # the resumed run unfroze the remaining layers at the uninterrupted run's steps
        assert resumed["details"]["finetuning"]["unfrozen_at_step"] == \
            reference["details"]["finetuning"]["unfrozen_at_step"] == {
                "layer_1": 0, "layer_0": 3, "embeddings": 6}
