"""hydra/launcher=gpu_pack: several jobs at once per device, each in a fresh process with its
share of the cores; a packed grid gives the same results as the grid run one job at a time;
a packing whose memory estimate does not fit is refused before any job starts; successive
halving packs the same way. On this CPU-only machine jobs_per_gpu jobs run at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from transformers import BertConfig, BertModel

from bertkit.training.throughput import GIB, job_memory, memory_kind
from hydra_plugins.bertkit_gpu_pack_launcher import gpu_pack_launcher
from hydra_plugins.bertkit_gpu_pack_launcher.gpu_pack_launcher import (
    MemoryEstimateConf,
    make_slots,
)
from tests.conftest import compose_config, tiny_run_overrides
from tests.sweeps.test_successive_halving import run_bertkit_in_process

# Two cores for every launch of these tests: one per job of two at once, and the basic
# launcher's one-thread jobs (OMP_NUM_THREADS=1) compute the same sums (CPU results depend on
# the threads that share a reduction).
CORES = sorted(os.sched_getaffinity(0))[:2] if hasattr(os, "sched_getaffinity") else None
MEMORY = OmegaConf.structured(MemoryEstimateConf)


def run_bertkit(tmp_path: Path, *overrides: str, check: bool = True
                ) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "bertkit", *overrides], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=900,
        preexec_fn=(lambda: os.sched_setaffinity(0, CORES)) if CORES else None)
    if check:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def tiny_grid(data: Path, vocab: Path, sweep_dir: Path, cache: Path) -> list[str]:
    """4 jobs: 2 learning rates x 2 seeds, a few steps each, named by their overrides."""
    overrides = [o for o in tiny_run_overrides("wnli", data, vocab)
                 if not o.startswith("trainer.learning_rate=")]
    return ["-m", *overrides, "trainer.learning_rate=1e-3,3e-4", "seed=1,2",
            "trainer.dataloader_num_workers=auto",
            f"hydra.sweep.dir={sweep_dir}", f"cache_dir={cache}",
            "hydra.sweep.subdir=lr${trainer.learning_rate}-seed${seed}"]


def results_of(sweep_dir: Path) -> dict[str, dict]:
    """Each job's metrics.json less what differs between any two runs: its files' paths,
    seconds and speeds."""
    def stable(record):
        if isinstance(record, dict):
            return {key: stable(value) for key, value in record.items()
                    if key not in ("files", "throughput") and not key.endswith("seconds")}
        return record
    return {path.parent.name: stable(json.loads(path.read_text()))
            for path in sweep_dir.rglob("metrics.json")}


def test_slots_go_round_robin_over_the_gpus_with_an_even_share_of_the_cores():
    slots = make_slots([("cuda:0", "3"), ("cuda:1", "5")], jobs_per_gpu=2,
                       cores=list(range(8)))
    assert [(slot.device, slot.gpu) for slot in slots] == [
        ("cuda:0", "3"), ("cuda:1", "5"), ("cuda:0", "3"), ("cuda:1", "5")]
    assert [slot.cores for slot in slots] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert slots[1].environment() == {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2",
                                      "RAYON_NUM_THREADS": "2", "CUDA_VISIBLE_DEVICES": "5"}
    # More jobs than cores: one core each, shared; on a CPU no GPU is named.
    cpu = make_slots([("cpu", None)], jobs_per_gpu=3, cores=[0, 1])
    assert [slot.cores for slot in cpu] == [(0,), (1,), (0,)]
    assert "CUDA_VISIBLE_DEVICES" not in cpu[0].environment()


def test_the_memory_estimate_of_bert_base_against_hand_numbers(tmp_path):
    """bert-base-uncased from its config.json (as a checkpoint folder), batch 32 x 128, on a
    GPU (bf16 activations): 109.5M parameters counted on the meta device."""
    checkpoint = tmp_path / "bert-base"
    checkpoint.mkdir()
    BertConfig().save_pretrained(checkpoint)
    cfg = compose_config(["recipe=glue", "task=mrpc", "model=bert_base_uncased",
                          f"model.name_or_path={checkpoint}",
                          "trainer.per_device_train_batch_size=32"])
    estimate = job_memory(cfg, MEMORY, on_gpu=True)
    assert estimate.parameters == 109_482_240  # BertModel(BertConfig()), embeddings and pooler
    activations = 32 * 128 * 768 * 12 * 17 * 2
    assert estimate.total_bytes == 109_482_240 * 16 + activations + 1.0 * GIB
    assert f"{estimate.total_bytes / GIB:.2f}" == "3.83"
    # On a CPU, mixed_precision=auto trains in fp32: activations take twice the bytes.
    assert job_memory(cfg, MEMORY, on_gpu=False).total_bytes == pytest.approx(
        estimate.total_bytes + activations)
    # SWAG feeds four sequences per example.
    swag = compose_config(["recipe=swag", "task=swag", "model=bert_base_uncased",
                           f"model.name_or_path={checkpoint}",
                           "trainer.per_device_train_batch_size=16"])
    assert job_memory(swag, MEMORY, on_gpu=True).batch == 64


def test_jobs_that_differ_only_in_keys_the_estimate_does_not_read_share_one_estimate():
    job = ["seed=3", "trainer.learning_rate=2e-5", "trainer.num_train_epochs=4",
           "trainer.per_device_train_batch_size=32", "model=bert_base_uncased",
           "model.config.hidden_size=64", "task.max_seq_length=256", "mixed_precision=fp16",
           "+recipe=glue"]
    assert memory_kind(job, groups={"model", "task", "recipe", "trainer"}) == (
        "trainer.per_device_train_batch_size=32", "model=bert_base_uncased",
        "model.config.hidden_size=64", "task.max_seq_length=256", "mixed_precision=fp16",
        "+recipe=glue")


@pytest.mark.slow
def test_a_packing_that_cannot_fit_is_refused_in_one_line_before_any_job_starts(
        glue_dir, vocab_dir, tmp_path, monkeypatch, capsys):
    """On a CPU through hydra.launcher.device_memory_gib: the largest job's estimate times the
    jobs on one device, against the memory, with the numbers, as bertkit's one line."""
    sweep_dir = tmp_path / "sweep"
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        run_bertkit_in_process(
            monkeypatch, *tiny_grid(glue_dir("wnli"), vocab_dir, sweep_dir, tmp_path / "cache"),
            "hydra/launcher=gpu_pack", "hydra.launcher.jobs_per_gpu=2",
            "hydra.launcher.device_memory_gib=1.5")
    assert exited.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    # scratch_tiny at hidden 32, counted here on a real model: 2 layers, the fixtures' words.
    vocab = len((vocab_dir / "vocab.txt").read_text().splitlines())
    tiny = BertModel(BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2,
                                num_attention_heads=2, intermediate_size=64))
    parameters = sum(p.numel() for p in tiny.parameters())
    assert line == (
        f"bertkit: error: hydra.launcher.jobs_per_gpu=2: 2 jobs x 1.0 GiB (model=scratch_tiny: "
        f"{parameters:,} parameters x 16 B (weights, gradients, AdamW states), batch 8 x 128 "
        f"tokens x 2 layers x 32 hidden x 17 fp32 activations, 1 GiB per process) = 2.0 GiB > "
        f"1.5 GiB hydra.launcher.device_memory_gib on cpu: at most 1 fit; lower "
        f"hydra.launcher.jobs_per_gpu, or the batch")
    assert not list(sweep_dir.rglob("metrics.json")) and not list(sweep_dir.rglob(".hydra"))


@pytest.mark.slow
def test_on_gpus_the_packing_is_checked_against_the_fullest_gpus_free_memory(
        glue_dir, vocab_dir, tmp_path, monkeypatch, capsys):
    """Two GPUs seen (faked: this machine has none), with 5 and 1.5 GiB free: 4 jobs go 2 per
    GPU, checked against cuda:1, with 16-bit activations (mixed_precision=auto on a GPU)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,7")
    monkeypatch.setattr(gpu_pack_launcher.GpuPackLauncher, "devices",
                        lambda launcher: gpu_pack_launcher.visible_gpus(2, launcher.gpus))
    monkeypatch.setattr(gpu_pack_launcher, "read_free_memory", lambda: [5 * GIB, 1.5 * GIB])
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        run_bertkit_in_process(
            monkeypatch, *tiny_grid(glue_dir("wnli"), vocab_dir, tmp_path / "sweep",
                                    tmp_path / "cache"),
            "hydra/launcher=gpu_pack", "hydra.launcher.jobs_per_gpu=3")
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("bertkit: error: hydra.launcher.jobs_per_gpu=3: 2 jobs x 1.0 GiB")
    assert "17 16-bit activations" in line
    assert line.endswith("= 2.0 GiB > 1.5 GiB free on cuda:1: at most 1 fit; lower "
                         "hydra.launcher.jobs_per_gpu, or the batch")
    assert gpu_pack_launcher.visible_gpus(2, [1]) == [("cuda:1", "7")]


@pytest.mark.slow
def test_a_packed_grid_gives_the_results_of_the_grid_run_one_job_at_a_time(
        glue_dir, vocab_dir, tmp_path):
    """The same 4 jobs through Hydra's basic launcher and through gpu_pack with 2 at once:
    equal metrics (CPU runs are deterministic); the packed jobs overlapped in time, each in a
    process of its own with one of the two cores, and each counted its cores from its share."""
    data = glue_dir("wnli", n_train=32)
    sequential, packed = tmp_path / "sequential", tmp_path / "packed"
    run_bertkit(tmp_path, *tiny_grid(data, vocab_dir, sequential, tmp_path / "cache"))
    run_bertkit(tmp_path, *tiny_grid(data, vocab_dir, packed, tmp_path / "cache"),
                "hydra/launcher=gpu_pack", "hydra.launcher.jobs_per_gpu=2",
                "hydra.launcher.device_memory_gib=80")
    expected = results_of(sequential)
    assert all(record["main_value"] is not None and record["train"]["steps"] == 4
               for record in expected.values())
    assert sorted(expected) == sorted(f"lr{lr}-seed{seed}" for lr in ("0.001", "0.0003")
                                      for seed in (1, 2))
    assert results_of(packed) == expected

    (launch,) = json.loads((packed / "gpu_pack.json").read_text())["launches"]
    jobs = launch["jobs"]
    assert launch["slots"] == 2 and len(jobs) == 4
    assert len({job["pid"] for job in jobs}) == 4  # a fresh process per job
    spans = sorted((job["started"], job["ended"]) for job in jobs)
    assert any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:], strict=False))
    share = max(1, len(CORES or [0, 1]) // 2)
    assert {(len(job["cores"]), job["threads"], job["device"]) for job in jobs} == {
        (share, share, "cpu")}
    for log in packed.rglob("cli.log"):  # trainer.dataloader_num_workers=auto saw the share
        assert f"(CPU, {share} cores, 1 process(es))" in log.read_text()


@pytest.mark.slow
def test_successive_halving_packs_through_gpu_pack(glue_dir, vocab_dir, tmp_path):
    """sweep=paper_grid_halving with hydra/launcher=gpu_pack: every rung is launched through
    the packing launcher (2 at once), and the rungs halve the configurations as usual."""
    sweep_dir = tmp_path / "sweep"
    overrides = [o for o in tiny_grid(glue_dir("wnli", n_train=32), vocab_dir, sweep_dir,
                                      tmp_path / "cache")
                 if not o.startswith(("hydra.sweep.subdir=", "seed="))]
    run_bertkit(tmp_path, *overrides, "sweep=paper_grid_halving", "seed=1",
                "trainer.max_steps=-1", "trainer.num_train_epochs=2",
                "hydra.sweeper.min_fraction=0.5", "hydra/launcher=gpu_pack",
                "hydra.launcher.jobs_per_gpu=2")
    ledger = json.loads((sweep_dir / "halving.json").read_text())
    assert [rung["jobs"] for rung in ledger["rungs"]] == [2, 1]  # half the schedule, then all
    launches = json.loads((sweep_dir / "gpu_pack.json").read_text())["launches"]
    assert [len(launch["jobs"]) for launch in launches] == [2, 1]
    (survivor,) = launches[1]["jobs"]
    assert "resume=true" in survivor["overrides"]
    first = sorted((job["started"], job["ended"]) for job in launches[0]["jobs"])
    assert first[1][0] < first[0][1]  # the first rung's two jobs ran at once
