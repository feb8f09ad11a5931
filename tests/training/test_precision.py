"""mixed_precision=auto picks what the device can run, and an explicit GPU precision without a
GPU is refused by name: the GPU-only path selected and the CPU fallback, on this CPU."""

from __future__ import annotations

import pytest

from bertkit.config_schema import check_ranges
from bertkit.errors import BertkitError
from bertkit.training import run as arguments
from bertkit.training.run import resolve_mixed_precision
from tests.conftest import compose_config


@pytest.mark.parametrize(("gpu", "bf16", "expected"), [
    (False, False, "no"), (True, True, "bf16"), (True, False, "fp16")])
def test_auto_follows_the_device(monkeypatch, gpu, bf16, expected):
    monkeypatch.setattr(arguments.torch.cuda, "is_available", lambda: gpu)
    monkeypatch.setattr(arguments.torch.cuda, "is_bf16_supported", lambda: bf16)
    assert resolve_mixed_precision("auto") == expected


def test_explicit_choices(monkeypatch):
    assert resolve_mixed_precision("no") == "no"
    with pytest.raises(BertkitError, match="mixed_precision=bf16: needs a GPU"):
        resolve_mixed_precision("bf16")
    with pytest.raises(BertkitError, match=r"^mixed_precision='fp8': expected one of auto"):
        check_ranges(compose_config(["mixed_precision=fp8"]))  # the schema, before a job
    monkeypatch.setattr(arguments.torch.cuda, "is_available", lambda: True)
    assert resolve_mixed_precision("fp16") == "fp16"


@pytest.mark.parametrize(("on_gpu", "cpus", "processes", "expected"), [
    (False, 16, 1, 0),   # a CPU: the cores train
    (True, 16, 1, 6),    # a GPU: gpu_dataloader_workers
    (True, 4, 1, 3),     # ... at most the cores less the training process's own
    (True, 16, 8, 1),    # 8 processes on 16 cores: 2 each, one of them trains
    (True, 1, 1, 0)])
def test_auto_dataloader_workers_follow_the_device_and_the_cores(on_gpu, cpus, processes,
                                                                 expected):
    assert arguments.resolve_dataloader_workers("auto", on_gpu, 6, cpus, processes) == expected
    assert arguments.resolve_dataloader_workers(2, on_gpu, 6, cpus, processes) == 2


@pytest.mark.parametrize("bad", [-1, "many", 1.5, True])
def test_bad_dataloader_workers_are_refused_by_key(bad):
    with pytest.raises(BertkitError, match="trainer.dataloader_num_workers="):
        arguments.resolve_dataloader_workers(bad, True, 6, 16, 1)


def test_pretraining_on_this_cpu_runs_masking_in_the_main_process(tmp_path):
    cfg = compose_config(["recipe=pretrain", "model.tokenizer=unused"])
    assert cfg.trainer.dataloader_num_workers == "auto"
    args = arguments.build_training_arguments(cfg, tmp_path, [])
    assert args.dataloader_num_workers == 0
