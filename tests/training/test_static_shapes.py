"""Static shapes leave the results as they were: a short batch filled up to the batch size with
rows that weigh nothing has the unpadded batch's loss, gradients and predictions, for every
family's head (the fill each family declares, TaskFamily.padded_rows); and when a finetune is
compiled (trainer.torch_compile=auto) and where its compile caches live."""

from __future__ import annotations

import os

import pytest
import torch
from omegaconf import OmegaConf
from transformers import (
    BertConfig,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    TrainingArguments,
)

from bertkit.tasks import FAMILIES, task_family
from bertkit.training import trainer as static_shapes
from bertkit.training.trainer import (
    REAL_ROWS,
    FixedRows,
    decide_compile,
    first_rows,
    planned_steps,
    prepare_compile,
)
from tests.conftest import compose_config

ROWS, WIDTH, FULL = 5, 12, 8
# Each family's head, its task settings, and its labels for `rows` examples.
HEADS = {
    "glue": (BertForSequenceClassification, {"num_labels": 3}, {"labels": ["a", "b", "c"]},
             lambda g, n: {"labels": torch.randint(0, 3, (n,), generator=g)}),
    "glue-regression": (BertForSequenceClassification, {"num_labels": 1}, {"labels": None},
                        lambda g, n: {"labels": torch.rand(n, generator=g) * 5}),
    "squad": (BertForQuestionAnswering, {}, {},
              lambda g, n: {"start_positions": torch.randint(0, WIDTH, (n,), generator=g),
                            "end_positions": torch.randint(0, WIDTH, (n,), generator=g)}),
    "swag": (BertForMultipleChoice, {}, {},
             lambda g, n: {"labels": torch.randint(0, 4, (n,), generator=g)}),
    "ner": (BertForTokenClassification, {"num_labels": 5}, {},
            lambda g, n: {"labels": torch.where(torch.rand(n, WIDTH, generator=g) < 0.3, -100,
                                                torch.randint(0, 5, (n, WIDTH), generator=g))}),
}


def test_every_family_has_a_head_here():
    assert {name.split("-")[0] for name in HEADS} == set(FAMILIES)


def features(name: str, rows: int) -> list[dict]:
    generator = torch.Generator().manual_seed(0)
    shape = (rows, 4, WIDTH) if name == "swag" else (rows, WIDTH)
    ids = torch.randint(5, 60, shape, generator=generator)
    lengths = torch.randint(3, WIDTH + 1, shape[:-1], generator=generator)
    mask = (torch.arange(WIDTH) < lengths[..., None]).long()
    batch = {"input_ids": ids * mask, "attention_mask": mask,
             "token_type_ids": torch.zeros_like(ids), **HEADS[name][3](generator, rows)}
    return [{key: value[row] for key, value in batch.items()} for row in range(rows)]


def stack(rows: list[dict]) -> dict:
    return {key: torch.stack([row[key] for row in rows]) for key in rows[0]}


def loss_and_outputs(model, batch: dict, loss_function):
    if loss_function is None:
        outputs = model(**batch)
        return outputs.loss, outputs
    labels = batch.pop("labels")
    outputs = model(**batch)
    return loss_function(outputs, labels), outputs


@pytest.mark.parametrize("name", HEADS)
def test_padded_rows_weigh_nothing(name):
    head, sizes, task, _ = HEADS[name]
    torch.manual_seed(0)
    config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32, **sizes)
    model = head(config).eval()  # no dropout: both batches see the same function
    padded_rows = task_family(name.split("-")[0]).padded_rows(OmegaConf.create(task))
    rows = features(name, ROWS)

    plain_loss, plain = loss_and_outputs(model, stack(rows), padded_rows.loss)
    plain_loss.backward()
    plain_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    batch = FixedRows(stack, FULL, padded_rows)(rows)
    assert batch.pop(REAL_ROWS) == ROWS
    assert batch["input_ids"].shape[0] == FULL
    padded_loss, padded = loss_and_outputs(model, batch, padded_rows.loss)
    padded_loss.backward()

    torch.testing.assert_close(padded_loss, plain_loss, rtol=1e-6, atol=1e-7)
    for plain_grad, parameter in zip(plain_grads, model.parameters(), strict=True):
        torch.testing.assert_close(parameter.grad, plain_grad, rtol=1e-5, atol=1e-7)
    for key in ("logits", "start_logits", "end_logits"):
        if key in plain:
            torch.testing.assert_close(first_rows(padded[key], ROWS), plain[key])


def test_a_full_batch_is_left_as_it_is():
    rows = features("glue", FULL)
    batch = FixedRows(stack, FULL, task_family("glue").padded_rows(
        OmegaConf.create({"labels": ["a"]})))(rows)
    assert REAL_ROWS not in batch and batch["input_ids"].shape[0] == FULL


def arguments(tmp_path, **options) -> TrainingArguments:
    return TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=32,
                             num_train_epochs=3, **options)


def test_planned_steps_follow_the_schedule(tmp_path):
    assert planned_steps(arguments(tmp_path), 3668) == 345  # MRPC: 115 batches x 3 epochs
    # Trainer: 115 batches // 2 + a last partial accumulation = 58 steps an epoch
    assert planned_steps(arguments(tmp_path, gradient_accumulation_steps=2), 3668) == 174
    assert planned_steps(arguments(tmp_path, max_steps=10), 3668) == 10
    assert planned_steps(arguments(tmp_path), 3668, processes=2) == 174


@pytest.mark.parametrize(("setting", "gpu", "steps", "compiled", "mode"), [
    ("auto", False, 10**6, False, None),        # the CPU stays eager
    ("auto", True, 4000, True, "reduce-overhead"),  # a long run on a GPU: CUDA graphs
    ("auto", True, 3999, False, None),          # too short to pay the compile back
    (True, False, 10, True, None),              # asked for: compiled, torch.compile's mode
    (True, True, 10, True, "reduce-overhead"),
    (False, True, 10**6, False, None),
])
def test_when_a_finetune_is_compiled(setting, gpu, steps, compiled, mode, tmp_path,
                                     monkeypatch):
    cfg = compose_config(["recipe=glue", "compile_min_steps=4000",
                          f"trainer.torch_compile={str(setting).lower()}"])
    args = arguments(tmp_path)
    monkeypatch.setattr(static_shapes.torch.cuda, "is_available", lambda: gpu)
    decide_compile(cfg, args, steps)
    assert (args.torch_compile, args.torch_compile_mode) == (compiled, mode)
    assert args.torch_compile_backend == ("inductor" if compiled else None)


def test_compile_caches_live_under_the_cache_dir_unless_the_user_chose(tmp_path, monkeypatch):
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    # Inductor's own default, as it writes it into the environment on first use
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    with torch._dynamo.config.patch(recompile_limit=8):  # restored after: other tests' limit
        prepare_compile(str(tmp_path), graphs=12)
        assert torch._dynamo.config.recompile_limit == 12  # every bucket's graph kept
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "torch_compile")
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "torch_compile" / "triton")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/theirs")
    prepare_compile(str(tmp_path / "other"), graphs=8)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/theirs"
