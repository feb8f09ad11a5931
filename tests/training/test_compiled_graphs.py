"""trainer.torch_compile=true compiles once per shape: one graph per pretraining phase, at
most one per padding bucket in finetuning, and no graph break, over real (tiny) runs. Read
from torch._dynamo's counters."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters
from transformers import DataCollatorWithPadding

from bertkit.pretraining.run import pretrain
from bertkit.tasks.glue.family import FAMILY
from bertkit.training.finetune import finetune
from tests.conftest import compose_config, tiny_run_overrides
from tests.pretraining.test_pretrain_recipe import tiny_pretraining_overrides

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
        "cache_dir": str(tmp_path / "cache"), "heldout.fraction": 0}))
    pretrain(cfg, tmp_path / "run")
    assert dynamo["stats"]["unique_graphs"] == 1  # one phase
    assert dict(dynamo["graph_break"]) == {}


@pytest.mark.slow
def test_glue_compiles_one_static_graph_per_bucket(dynamo, glue_dir, vocab_dir, tmp_path,
                                                   monkeypatch):
    widths = set()
    collate = DataCollatorWithPadding.__call__

    def recording(self, features):
        batch = collate(self, features)
        widths.add(batch["input_ids"].shape[1])
        return batch

    monkeypatch.setattr(DataCollatorWithPadding, "__call__", recording)
    cfg = compose_config(tiny_run_overrides("rte", glue_dir("rte", n_train=120), vocab_dir,
                                            **COMPILED, cache_dir=str(tmp_path / "cache"),
                                            **{"task.max_seq_length": 64}))
    finetune(cfg, FAMILY, tmp_path / "run")
    assert widths and all(width % cfg.bucket_width == 0 for width in widths)
    assert dynamo["stats"]["unique_graphs"] == len(widths)  # static, one per bucket
    assert dict(dynamo["graph_break"]) == {}
