"""The bench_step recipe: the three ways are timed on both workloads, the ratios follow from the
ms per step, and the host syncs counted per step are none for bertkit's trainer and some for
the plain Trainer (its NaN/Inf filter of the loss reads it every step)."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.command import compose_config as compose_benchmark
from benchmarks.step_cost import (
    JOB,
    RATIOS,
    RESULT_FILE,
    WAYS,
    FeedBatches,
    benchmark_step_cost,
    build_batches,
    table,
)
from bertkit.errors import BertkitError
from bertkit.jobs import run_job as run_bertkit_job
from bertkit.pretraining.masking import IGNORE_INDEX


def compose_config(overrides: list[str], with_hydra: bool = False):
    """The config `python -m benchmarks.step_cost <overrides>` runs."""
    return compose_benchmark("bench_step", overrides, with_hydra)


def run_job(cfg, run_dir=None) -> dict:
    """What `python -m benchmarks.step_cost` runs: bertkit's run_job, the
    benchmark's job."""
    return run_bertkit_job(cfg, run_dir, job=JOB)


STEPS, BATCH, LENGTH, SLOTS, USED = 3, 8, 32, 6, 5


def bench_overrides(**extra) -> list[str]:
    overrides = {
        "bench.steps": STEPS,
        "bench.warmup_steps": 1,
        "bench.repeats": 1,
        "bench.sync_steps": 3,
        "bench.model.vocab_size": 64,
        "bench.model.hidden_size": 16,
        "bench.model.intermediate_size": 32,
        "bench.model.num_attention_heads": 2,
        "bench.model.num_hidden_layers": 1,
        **{f"bench.{workload}.{key}": value for workload in ("pretraining", "glue")
           for key, value in (("batch_size", BATCH), ("seq_length", LENGTH),
                              ("padded_share", 0.5), ("min_length", USED + 2), ("batches", 2))},
        "bench.pretraining.mlm_slots": SLOTS,
        "bench.pretraining.mlm_used": USED,
        **extra,
    }
    return [f"{key}={value}" for key, value in overrides.items()]


@pytest.mark.slow
def test_three_ways_on_both_workloads(tmp_path):
    cfg = compose_config(bench_overrides())
    run_dir = tmp_path / "run"

    result = run_job(cfg, run_dir)

    assert json.loads((run_dir / RESULT_FILE).read_text()) == result
    assert set(result["workloads"]) == {"pretraining", "pretraining_packed", "glue"}
    for name, workload in result["workloads"].items():
        ways = workload["ways"]
        assert set(ways) == set(WAYS)
        for way in ways.values():
            assert way["ms_per_step"] > 0 and len(way["ms_per_step_each_repeat"]) == 1
        for a, b in RATIOS:
            assert workload["ratio"][f"{a}/{b}"] == pytest.approx(
                ways[a]["ms_per_step"] / ways[b]["ms_per_step"])
        # bertkit's step reads nothing back; the plain Trainer's loss filter does, every step.
        assert ways["bertkit"]["syncs_per_step"] == 0, (name, ways["bertkit"]["sync_sources"])
        assert ways["plain"]["syncs_per_step"] > 0, name
        assert ways["plain"]["steps_counted"] == 2  # the last step logs and is left out
        assert 0 < workload["real_token_share"] < 1  # the padding-mask path is exercised
    assert result["workloads"]["pretraining"]["model_class"] == "MaskedOnlyBertForPreTraining"
    # The CPU proxy of padding-free batches: the same token budget, more of it real.
    padded, packed = (result["workloads"][name] for name in ("pretraining", "pretraining_packed"))
    assert packed["batch_size"] == BATCH and packed["seq_length"] == LENGTH
    assert packed["real_token_share"] > padded["real_token_share"]
    assert packed["real_tokens_per_step"] == pytest.approx(
        packed["real_token_share"] * BATCH * LENGTH)
    ratio = packed["real_tokens_per_step"] / padded["real_tokens_per_step"]
    assert f"{ratio:.3f}x the real tokens per step" in table(result)
    assert result["steps"] == STEPS and result["torch_threads"] == 1
    assert result["trainer"]["optim"] == "adamw_torch_fused"
    assert result["torch"] == torch.__version__ and result["model"]["vocab_size"] == 64
    assert not (run_dir / "checkpoints").exists()


def test_pretraining_batches_fill_the_slots_inside_each_row():
    cfg = compose_config(bench_overrides())
    batches = build_batches(cfg.bench, cfg.seed, "pretraining")
    assert len(batches) == 2
    for batch in batches:
        assert batch["input_ids"].shape == (BATCH, LENGTH)
        assert batch["mlm_positions"].shape == batch["mlm_labels"].shape == (BATCH, SLOTS)
        lengths = batch["attention_mask"].sum(1)
        used = batch["mlm_labels"] != IGNORE_INDEX
        assert (used.sum(1) == USED).all()
        positions = batch["mlm_positions"]
        assert (positions[used] > 0).all() and (positions[~used] == 0).all()
        assert (positions < (lengths - 1)[:, None]).all()
        for row, mask in zip(positions, used, strict=True):
            assert len(set(row[mask].tolist())) == USED  # distinct positions
        assert ((batch["input_ids"] == 0) == (batch["attention_mask"] == 0)).all()
    assert torch.equal(build_batches(cfg.bench, cfg.seed, "pretraining")[1]["input_ids"],
                       batches[1]["input_ids"])


def test_packed_batches_lay_the_pretraining_lengths_end_to_end():
    cfg = compose_config(bench_overrides())
    for batch in build_batches(cfg.bench, cfg.seed, "pretraining_packed"):
        assert batch["input_ids"].shape == batch["position_ids"].shape == (1, BATCH * LENGTH)
        lengths = batch["sequence_lengths"][batch["sequence_lengths"] > 0]
        total = int(lengths.sum())
        assert total <= BATCH * LENGTH and len(lengths) > BATCH // 2
        assert ((lengths >= USED + 2) & (lengths <= LENGTH)).all()  # the workload's lengths
        assert batch["position_ids"][0, :total].tolist() == \
            [p for n in lengths.tolist() for p in range(n)]
        ids = batch["input_ids"][0]
        assert (ids[total:] == 0).all() and (ids[:total] > 0).all()
        used = batch["mlm_labels"] != IGNORE_INDEX
        positions = batch["mlm_positions"][used]
        starts = torch.cumsum(lengths, 0) - lengths
        # Every masked slot is inside a sequence, never its [CLS] nor its last token.
        owner = torch.searchsorted(starts, positions, right=True) - 1
        inside = positions - starts[owner]
        assert ((inside > 0) & (inside < lengths[owner] - 1)).all()
        scored = batch["next_sentence_label"] != IGNORE_INDEX
        assert int(scored.sum()) == len(lengths)


def test_the_collator_hands_over_copies_of_the_batches_in_turn():
    batches = [{"x": torch.zeros(1)}, {"x": torch.ones(1)}]
    feed = FeedBatches(batches)
    fed = [feed([0, 1]) for _ in range(3)]
    assert [float(batch["x"]) for batch in fed] == [0.0, 1.0, 0.0]
    del fed[0]["x"]
    assert "x" in batches[0]


@pytest.mark.parametrize(("override", "message"), [
    ("bench.sync_steps=1", "at least 2"),
    ("bench.workloads=[squad]", "expected some of"),
    ("bench.pretraining.min_length=4", "min_length"),
])
def test_settings_it_cannot_use_are_refused(override, message, tmp_path):
    cfg = compose_config([*bench_overrides(), override])
    with pytest.raises(BertkitError, match=message):
        benchmark_step_cost(cfg, run_dir=tmp_path / "run")
