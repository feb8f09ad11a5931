"""Compiled runs make one graph per shape, read from torch._dynamo's counters over real (tiny)
runs: one per pretraining phase; in finetuning, for every family, at most one per padding bucket
for training and one per bucket for evaluation (the last, partial batches filled up to the batch
size), and no graph break. The runs compile with Dynamo's eager backend: the same graphs and guards
as Inductor's, without generating kernels (seconds, not minutes, on a CPU)."""

from __future__ import annotations

import json

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters
from transformers import Trainer

from bertkit.jobs import run_job
from bertkit.pretraining.run import pretrain
from bertkit.tasks import FAMILIES
from tests.conftest import compose_config
from tests.finetuning.test_every_family import family_run  # noqa: F401
from tests.pretraining.test_pretrain_recipe import tiny_pretraining_overrides
from tests.tasks.ner.test_ner_recipe import conll_files  # noqa: F401
from tests.tasks.squad.test_squad_recipe import squad_files  # noqa: F401
from tests.tasks.swag.test_swag_recipe import swag_files  # noqa: F401

COMPILED = {"trainer.torch_compile": True, "trainer.max_steps": 12,
            "trainer.logging_steps": 5}


@pytest.fixture
def dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield counters
    torch._dynamo.reset()


@pytest.mark.slow
@pytest.mark.parametrize("arm", [{}, {"masking": "dynamic", "objective": "mlm"}],
                         ids=["static-nsp", "dynamic-mlm"])
def test_pretraining_compiles_one_graph_per_phase(arm, dynamo, tmp_path):
    cfg = compose_config(tiny_pretraining_overrides(**COMPILED, **arm, **{
        "+trainer.torch_compile_backend": "eager",
        "cache_dir": str(tmp_path / "cache"), "heldout.fraction": 0}))
    pretrain(cfg, tmp_path / "run")
    assert dynamo["stats"]["unique_graphs"] == 1  # one phase
    assert dict(dynamo["graph_break"]) == {}


@pytest.fixture
def batch_shapes(monkeypatch):
    """(training?, rows, width) of every batch the model is given, read where Trainer's step
    and prediction step receive them."""
    shapes = []
    training_step, prediction_step = Trainer.training_step, Trainer.prediction_step

    def width(inputs):
        ids = inputs["input_ids"]
        return ids.shape[0], ids.shape[-1]

    def recording_training_step(self, model, inputs, *args, **kwargs):
        shapes.append((True, *width(inputs)))
        return training_step(self, model, inputs, *args, **kwargs)

    def recording_prediction_step(self, model, inputs, *args, **kwargs):
        shapes.append((False, *width(inputs)))
        return prediction_step(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(Trainer, "training_step", recording_training_step)
    monkeypatch.setattr(Trainer, "prediction_step", recording_prediction_step)
    return shapes


# Every family, and GLUE's regression head (its padded rows weigh nothing another way). The data
# sizes leave a partial last batch in training and in evaluation (batches of 8).
CASES = {**{family: family for family in FAMILIES}, "glue-regression": "glue"}
# Buckets of 8 tokens: several widths even in the fixtures' short sentences.
STATIC = {**COMPILED, "+trainer.torch_compile_backend": "eager", "bucket_width": 8,
          "trainer.max_steps": 7, "trainer.eval_strategy": "steps", "trainer.eval_steps": 7,
          "trainer.save_steps": 7}


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_a_compiled_finetune_makes_one_graph_per_bucket_for_training_and_for_evaluation(
        case, family_run, batch_shapes, dynamo, glue_dir, vocab_dir, tmp_path):  # noqa: F811
    if case == "glue-regression":
        from tests.conftest import tiny_run_overrides
        cfg = compose_config(tiny_run_overrides("stsb", glue_dir("stsb", n_train=44, n_dev=13),
                                                vocab_dir, **STATIC))
    else:
        cfg = family_run(CASES[case], STATIC)
    record = run_job(cfg, tmp_path / "run")

    train = {(rows, width) for training, rows, width in batch_shapes if training}
    evaluation = {(rows, width) for training, rows, width in batch_shapes if not training}
    assert train and evaluation
    # Every batch at its full rows, every width a bucket's.
    assert {rows for rows, _ in train} == {cfg.trainer.per_device_train_batch_size}
    assert {rows for rows, _ in evaluation} == {cfg.trainer.per_device_eval_batch_size}
    assert all(width % cfg.bucket_width == 0 for _, width in train | evaluation)
    # One graph per bucket for training, one per bucket for evaluation: no recompile.
    assert dynamo["stats"]["unique_graphs"] == len(train) + len(evaluation)
    assert dict(dynamo["graph_break"]) == {}
    assert record["details"]["compile"]["graphs"] == len(train) + len(evaluation)
    assert record["details"]["compile"]["graph_breaks"] == 0
    scores = json.loads((tmp_path / "run" / "metrics.json").read_text())["validation"]
    assert all(value == value for split in scores.values() for value in split.values()
               if isinstance(value, float))  # no NaN from the padded rows
