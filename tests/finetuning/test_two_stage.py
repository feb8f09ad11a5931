"""Two-stage finetuning (STILTs) in one command: the intermediate task's run below the target's
run directory, the target starting from its encoder with a new head of the target's size."""

from __future__ import annotations

import json

import torch
from huggingface_hub import ModelCard
from safetensors.torch import load_file

from bertkit.jobs import run_job
from bertkit.jobs.two_stage import stage_configs
from tests.conftest import compose_config, tiny_run_overrides


def weights(directory) -> dict[str, torch.Tensor]:
    return load_file(str(directory / "model.safetensors"))


def test_the_target_starts_from_the_intermediate_encoder_with_a_new_head(glue_dir, vocab_dir,
                                                                         tmp_path):
    mrpc, stsb = glue_dir("mrpc"), glue_dir("stsb")
    # The target's encoder frozen whole: what it ends with is what it started from.
    cfg = compose_config(tiny_run_overrides(
        "mrpc", mrpc, vocab_dir, **{"finetuning": "stilts",
                                    "finetuning.intermediate.task": "stsb",
                                    "finetuning.intermediate.data_dir": str(stsb),
                                    "+finetuning.intermediate.trainer.max_steps": 6,
                                    "finetuning.freeze_embeddings": True,
                                    "finetuning.freeze_layers": 2}))
    run_dir = tmp_path / "run"
    record = run_job(cfg, run_dir)

    first = json.loads((run_dir / "intermediate" / "metrics.json").read_text())
    assert first["task"] == "stsb" and first["train"]["steps"] == 6
    assert first["hyperparameters"]["finetuning"]["name"] == "full"  # plain first stage
    assert record["task"] == "mrpc" and record["train"]["steps"] == 4
    # Named by the checkpoint it all started from (a from-scratch model here), not by the
    # per-run intermediate encoder: seeds of one STILTs setting are one system of the report.
    assert record["model"] == first["model"] == "from_scratch"
    assert record["details"]["intermediate"]["task"] == "stsb"
    assert record["details"]["intermediate"]["main_value"] == first["main_value"]
    assert record["hyperparameters"]["finetuning"]["intermediate"]["task"] == "stsb"
    assert json.loads((run_dir / "metrics.json").read_text()) == record

    # The exported encoder carries the first stage's model card, as every model directory does
    card = ModelCard.load(run_dir / "intermediate" / "encoder" / "README.md")
    assert card.data.eval_results[0].dataset_config == "stsb"
    assert (run_dir / "intermediate" / "encoder" / "README.md").read_text() == (
        run_dir / "intermediate" / "model" / "README.md").read_text()
    stage_one = weights(run_dir / "intermediate" / "model")
    encoder = weights(run_dir / "intermediate" / "encoder")
    target = weights(run_dir / "model")
    assert not any(key.startswith("classifier") for key in encoder)  # no head to inherit
    encoder_keys = [k for k in stage_one if k.startswith(("bert.embeddings", "bert.encoder"))]
    assert encoder_keys
    for key in encoder_keys:
        # the exported encoder is the first stage's, and the target began from it
        assert torch.equal(encoder[key.removeprefix("bert.")], stage_one[key]), key
        assert torch.equal(target[key], stage_one[key]), key
    assert stage_one["classifier.weight"].shape == (1, 32)  # STS-B: regression
    assert target["classifier.weight"].shape == (2, 32)  # MRPC: two classes


def test_both_stages_share_the_w_and_b_group_and_tag_their_stage(tmp_path):
    cfg = compose_config(["recipe=glue", "task=rte", "finetuning=stilts",
                          "finetuning.intermediate.task=mnli",
                          "+finetuning.intermediate.trainer.max_steps=100"])
    first, second = stage_configs(cfg, tmp_path)
    assert first.task.name == "mnli" and second.task.name == "rte"
    assert first.logger.group == second.logger.group == "glue-rte"
    assert "stage:intermediate" in first.logger.tags and "task:mnli" in first.logger.tags
    assert "stage:target" in second.logger.tags and "task:rte" in second.logger.tags
    assert first.trainer.max_steps == 100 and second.trainer.max_steps == -1
    assert first.finetuning.name == "full" and first.finetuning.intermediate.task is None
    assert second.model.name_or_path == str(tmp_path / "intermediate" / "encoder")
    assert second.model.started_from == cfg.model.name_or_path
    # bert_base_uncased names its tokenizer after its checkpoint (${.name_or_path}): the target
    # keeps the run's tokenizer, not the encoder directory's.
    assert second.model.tokenizer == cfg.model.name_or_path == first.model.tokenizer
