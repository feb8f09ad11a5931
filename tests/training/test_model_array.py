"""A model array (hydra/launcher=fused) trains each member as the member's job would train
alone: with dropout off, every member's per-step training losses and its final dev scores equal
those of the same job run alone (fp32 on the CPU: 1e-4 relative), for every task family
(bertkit.tasks.FAMILIES) and GLUE's regression task. The members differ in every kind of key a
member may vary: learning rate, seed, weight decay, warmup, max_grad_norm (one clipped hard)."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

from bertkit.config_paths import config_dir
from bertkit.finetuning.methods import METHODS
from bertkit.jobs.fused import PER_MEMBER_METHODS, finish_member, prepare_member, train_group
from bertkit.tasks import FAMILIES, task_family
from bertkit.training.finetune import finish_run, prepare_run
from bertkit.training.model_array import MemberOptimizers, ModelArray, stack_batches
from bertkit.training.run import train_run
from tests.conftest import compose_config
from tests.family_fixtures import tiny_family_run
from tests.glue_fixtures import write_glue_task

RELATIVE = 1e-4
# Dev scores of 8 examples: a correlation moves by 1e-4 of itself at parameters 1e-7 apart.
SCORES = 1e-3
# Each member differs from the first in the keys a member may vary.
MEMBERS = [
    ["trainer.learning_rate=3e-4", "seed=1"],
    ["trainer.learning_rate=1e-4", "seed=2", "trainer.weight_decay=0.01",
     "trainer.warmup_steps=0.3"],
    ["trainer.learning_rate=5e-4", "seed=3", "trainer.max_grad_norm=0.05"],
]
SIZES = (24, 8, 8)
COMMON = {"logger": "none", "model.hidden_dropout_prob": 0.0,
          "model.attention_probs_dropout_prob": 0.0, "trainer.logging_steps": 1,
          "trainer.num_train_epochs": 2, "trainer.per_device_train_batch_size": 8,
          "trainer.lr_scheduler_type": "linear", "trainer.eval_strategy": "epoch"}


def _stsb(tmp_path):
    data = write_glue_task("stsb", tmp_path / "stsb", *SIZES, random.Random(0))
    overrides, _ = tiny_family_run("glue", tmp_path, SIZES, **COMMON)
    return [o for o in overrides if not o.startswith(("task=", "task.data_dir="))] + [
        "task=stsb", f"task.data_dir={data}"]


def _method(preset: str):
    def overrides(tmp_path):
        base, _ = tiny_family_run("glue", tmp_path, SIZES, **COMMON)
        return [*base, f"finetuning={preset}"]
    return overrides


def per_member_presets() -> list[str]:
    """The presets of conf/finetuning/ that turn on only methods an array trains per member
    (bertkit.jobs.fused.PER_MEMBER_METHODS), read from conf/ rather than listed."""
    presets = []
    for path in sorted((Path(config_dir()) / "finetuning").glob("*.yaml")):
        node = compose_config([f"finetuning={path.stem}"]).finetuning
        on = {name for name, entry in METHODS.items() if entry.on(node)}
        if on and on <= set(PER_MEMBER_METHODS):
            presets.append(path.stem)
    return presets


# Every family, GLUE's regression task, and each finetuning method an array trains per member.
CASES = {**{family: None for family in FAMILIES}, "glue-stsb": _stsb,
         **{f"glue-{preset}": _method(preset) for preset in per_member_presets()}}


# SQuAD cuts each question's passage into windows: fewer examples for as many steps.
FAMILY_SIZES = {"squad": (12, 6, 6)}


def _overrides(case: str, tmp_path) -> list[str]:
    if CASES[case] is not None:
        return CASES[case](tmp_path)
    overrides, _ = tiny_family_run(case, tmp_path, FAMILY_SIZES.get(case, SIZES), **COMMON)
    return overrides


def _losses(trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def _close(a: float, b: float, relative: float = RELATIVE) -> bool:
    return math.isclose(a, b, rel_tol=relative, abs_tol=1e-6)


# GLUE in the fast suite; the other cases (a minute each for SQuAD) in the slow one (CI).
@pytest.mark.parametrize("case", [pytest.param(case, marks=() if case == "glue"
                                               else pytest.mark.slow) for case in CASES])
def test_each_member_trains_as_its_job_alone(case, tmp_path):

    base = _overrides(case, tmp_path)
    configs = [compose_config(base + member) for member in MEMBERS]
    family = task_family(configs[0].task.family)
    alone = []
    for k, cfg in enumerate(configs):
        run = prepare_run(cfg, family, tmp_path / "alone" / str(k))
        trained = train_run(cfg, run.setup, run.trainer, run.hyperparameters)
        alone.append((_losses(run.trainer), finish_run(run, trained)))
    runs = [prepare_member(cfg, tmp_path / "fused" / str(k)) for k, cfg in enumerate(configs)]
    results = train_group(runs)
    for k, (run, result) in enumerate(zip(runs, results, strict=True)):
        losses = _losses(run.trainer)
        record = finish_member(run, result)
        alone_losses, alone_record = alone[k]
        assert len(losses) == len(alone_losses) > 4
        losses_tolerance, scores_tolerance = RELATIVE, SCORES
        drift = max(abs(a - b) / abs(b) for a, b in zip(losses, alone_losses, strict=True))
        print(f"{case} member {k}: losses within {drift:.2e} relative over {len(losses)} steps")
        assert drift <= losses_tolerance, f"member {k}: losses {drift:.2e} relative apart"
        for split, scores in alone_record["validation"].items():
            for metric, value in scores.items():
                fused = record["validation"][split][metric]
                print(f"  {split} {metric}: fused {fused:.6f}, alone {value:.6f}")
                assert _close(fused, value, scores_tolerance), (k, split, metric)
        assert record["train"]["steps"] == alone_record["train"]["steps"]
        assert _close(record["train"]["loss"], alone_record["train"]["loss"], losses_tolerance)
        assert (tmp_path / "fused" / str(k) / "model" / "config.json").is_file()
    # The members really differ: a fused run of one member copied into all would pass the
    # per-member comparison for that member only.
    assert len({round(_losses(run.trainer)[-1], 6) for run in runs}) == len(runs)


def _tiny_models(count: int):
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    models = []
    for seed in range(count):
        torch.manual_seed(seed)
        models.append(BertForSequenceClassification(config))
    return models


def test_each_members_optimizer_steps_its_slice_as_it_steps_its_model_alone():
    """Three steps of MemberOptimizers against each member's torch AdamW (fused, as Trainer
    builds it) and clip_grad_norm_ on the member alone, with each member's own rate, decay,
    betas and clipping: equal but for the last bits of the gradients (vmap's batched matmuls
    round differently from one model's)."""
    models = _tiny_models(2)
    settings = [dict(lr=1e-2, weight_decay=0.1, betas=(0.9, 0.999), eps=1e-8, clip=0.01),
                dict(lr=3e-3, weight_decay=0.0, betas=(0.8, 0.99), eps=1e-6, clip=100.0)]

    def optimizer(model, s):
        return torch.optim.AdamW(model.parameters(), lr=s["lr"], weight_decay=s["weight_decay"],
                                 betas=s["betas"], eps=s["eps"], fused=True)

    array = ModelArray(models)
    fused = MemberOptimizers(array, models, [optimizer(m, s) for m, s in zip(models, settings,
                                                                               strict=True)],
                             [s["clip"] for s in settings])
    alone = [optimizer(m, s) for m, s in zip(models, settings, strict=True)]
    batch = {"input_ids": torch.randint(1, 40, (2, 4, 6)), "labels": torch.tensor([[0, 1] * 2] * 2)}
    for _ in range(3):
        array.zero_grad()
        array(**batch).loss.backward()
        fused.step()
        for k, (model, member) in enumerate(zip(models, alone, strict=True)):
            member.zero_grad()
            model(input_ids=batch["input_ids"][k], labels=batch["labels"][k]).loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), settings[k]["clip"])
            member.step()
    stacked = array.tensors()
    for k, model in enumerate(models):
        for name, parameter in model.named_parameters():
            torch.testing.assert_close(stacked[name][k], parameter, rtol=1e-4, atol=1e-6)


def test_batches_of_different_widths_stack_padded_where_they_weigh_nothing():
    narrow = {"input_ids": torch.tensor([[5, 6]]), "labels": torch.tensor([[1, 2]])}
    wide = {"input_ids": torch.tensor([[5, 6, 7]]), "attention_mask": torch.tensor([[1, 1, 1]]),
            "labels": torch.tensor([[1, 2, 3]])}
    stacked = stack_batches([narrow, wide], pad_token_id=0)
    assert stacked["input_ids"].tolist() == [[[5, 6, 0]], [[5, 6, 7]]]
    assert stacked["attention_mask"].tolist() == [[[1, 1, 0]], [[1, 1, 1]]]
    assert stacked["labels"].tolist() == [[[1, 2, -100]], [[1, 2, 3]]]


def test_an_embeddings_padding_row_gets_no_gradient_in_the_array_as_alone():
    """torch's embedding backward skips padding_idx; vmap's does not: the array zeroes it
    (SQuAD's span loss reads the padded positions, so a trained [PAD] row would move it)."""
    models = _tiny_models(2)
    array = ModelArray(models)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in models]
    fused = MemberOptimizers(array, models, optimizers, [1.0, 1.0])
    pad = models[0].config.pad_token_id
    batch = {"input_ids": torch.tensor([[[5, 6, pad, pad]] * 2] * 2),
             "labels": torch.tensor([[0, 1]] * 2)}
    before = array.stacked["bert/embeddings/word_embeddings/weight"].detach().clone()
    array(**batch).loss.backward()
    assert array.stacked["bert/embeddings/word_embeddings/weight"].grad[:, pad].abs().sum() > 0
    fused.step()
    after = array.stacked["bert/embeddings/word_embeddings/weight"]
    assert torch.equal(after[:, pad], before[:, pad])
    assert not torch.equal(after[:, 5], before[:, 5])
