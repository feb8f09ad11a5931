"""bench_pretrain_quality: the plain way's data is run_mlm.py's group_texts, both ways are
scored on the very same held-out set, the plain schedule is sized to the budget, the time to
quality is read off the curves, and an interrupted benchmark keeps the arms it finished."""

from __future__ import annotations

import json

import datasets
import pytest
from huggingface_hub import ModelCard
from transformers import BertTokenizerFast, Trainer

from benchmarks import pretrain_quality
from benchmarks.command import compose_config as compose_benchmark
from benchmarks.pretrain_quality import (
    FIGURE_FILE,
    RESULT_FILE,
    arm_directory,
    benchmark_pretrain_quality,
    grouped_blocks,
    time_to_reach,
)
from bertkit.errors import BertkitError
from bertkit.training import run as run_module
from bertkit.training.stop_and_resume import TrainingClock


def compose_config(overrides: list[str], with_hydra: bool = False):
    """The config `python -m benchmarks.pretrain_quality <overrides>` runs."""
    return compose_benchmark("bench_pretrain_quality", overrides, with_hydra)


STEP_SECONDS = 2.0
BUDGET_MINUTES = 1.0  # 30 fake steps


def test_time_to_reach_interpolates_between_evaluations():
    curve = [{"elapsed_seconds": 0.0, "mlm_loss": 9.0},
             {"elapsed_seconds": 10.0, "mlm_loss": 7.0},
             {"elapsed_seconds": 30.0, "mlm_loss": 5.0}]
    assert time_to_reach(curve, 9.5) == 0.0
    assert time_to_reach(curve, 7.0) == 10.0
    assert time_to_reach(curve, 6.0) == pytest.approx(20.0)
    assert time_to_reach(curve, 8.5) == pytest.approx(2.5)
    assert time_to_reach(curve, 4.9) is None


@pytest.fixture
def word_tokenizer(tmp_path):
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    (tmp_path / "vocab.txt").write_text("\n".join(
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."] + words) + "\n")
    return BertTokenizerFast.from_pretrained(str(tmp_path))


def test_plain_blocks_are_run_mlm_group_texts(word_tokenizer):
    """Every text tokenized with its special tokens, all of it concatenated, cut in blocks of
    exactly block_size, the remainder dropped: computed here by hand."""
    documents = datasets.Dataset.from_dict({"sentences": [
        ["alpha beta gamma.", "delta epsilon."], ["zeta eta theta alpha."],
        ["beta beta.", "gamma delta epsilon zeta.", "eta."]]})
    stream = []
    assert word_tokenizer.unk_token_id not in word_tokenizer("alpha beta.")["input_ids"]
    for sentences in documents["sentences"]:
        stream += word_tokenizer(" ".join(sentences))["input_ids"]
    block = 5
    blocks = grouped_blocks(documents, word_tokenizer, block)
    assert all(len(ids) == block for ids in blocks["input_ids"])
    assert sum(blocks["input_ids"], []) == stream[:len(stream) // block * block]
    assert len(blocks) == len(stream) // block
    # DataCollatorForLanguageModeling skips special tokens with the mask run_mlm.py keeps.
    flat_special = sum(blocks["special_tokens_mask"], [])
    flat_ids = sum(blocks["input_ids"], [])
    assert [bool(flag) for flag in flat_special] == [
        token in word_tokenizer.all_special_ids for token in flat_ids]


@pytest.fixture
def fake_time(monkeypatch):
    """Every training clock reads a fake time that moves STEP_SECONDS per training step, in
    both ways (bertkit's run and the plain Trainer), so the budget is a number of steps."""
    now = [0.0]
    original = Trainer.training_step

    def training_step(self, *args, **kwargs):
        now[0] += STEP_SECONDS
        return original(self, *args, **kwargs)

    monkeypatch.setattr(run_module, "training_clock", lambda: TrainingClock(lambda: now[0]))
    monkeypatch.setattr(Trainer, "training_step", training_step)
    return now


def bench_config(tmp_path, **extra):
    overrides = {
        "experiment": "bench_pretrain_quality",
        "cache_dir": str(tmp_path / "cache"),
        "corpus": "demo", "corpus.synthetic.num_documents": 40,
        "tokenizer_training.vocab_size": 200,
        "model.config.hidden_size": 32, "model.config.intermediate_size": 64,
        "model.config.num_hidden_layers": 2, "model.config.num_attention_heads": 2,
        "pretraining.max_seq_length": 64,
        "trainer.per_device_train_batch_size": 4, "trainer.save_strategy": "no",
        "trainer.disable_tqdm": True,
        "budget.minutes": BUDGET_MINUTES, "heldout.every_seconds": 10,
        "heldout.max_sequences": 16, "heldout.fraction": 0.1,
        "bench.plain.learning_rates": "[1e-3,3e-3]", "bench.plain.timing_steps": 3,
        **extra,
    }
    return compose_config([f"{key}={value}" for key, value in overrides.items()])


@pytest.mark.slow
def test_both_ways_train_the_budget_and_are_scored_on_the_same_heldout_set(tmp_path,
                                                                          fake_time):
    run_dir = tmp_path / "bench"
    result = benchmark_pretrain_quality(bench_config(tmp_path), run_dir)
    assert list(result["arms"]) == ["bertkit", "plain lr=0.001", "plain lr=0.003"]
    budget_steps = int(BUDGET_MINUTES * 60 / STEP_SECONDS)
    bertkit_record = json.loads((run_dir / "bertkit" / "metrics.json").read_text())
    # The same held-out masked positions for both ways.
    assert result["settings"]["heldout_fingerprint"] == bertkit_record["heldout"]["fingerprint"]
    for name, arm in result["arms"].items():
        assert arm["steps"] == budget_steps, name  # every arm stops when the time is spent
        curve = arm["curve"]
        assert curve[0]["step"] == 0 and curve[-1] == arm["final"]
        assert arm["final"]["elapsed_seconds"] == pytest.approx(BUDGET_MINUTES * 60)
        assert [p["elapsed_seconds"] for p in curve] == sorted(p["elapsed_seconds"]
                                                             for p in curve)
    for name in ("plain lr=0.001", "plain lr=0.003"):
        arm = result["arms"][name]
        # Sized to the budget by the timed throwaway run (STEP_SECONDS a step), not cut.
        assert arm["seconds_per_step_timed"] == pytest.approx(STEP_SECONDS)
        assert arm["planned_steps"] == budget_steps and not arm["stopped_by_time"]
        model_dir = tmp_path / "bench" / arm_directory(name) / "model"
        assert (model_dir / "config.json").exists() and "=" not in str(model_dir)
        # Its model card: the arm's held-out scores in the model-index.
        card = ModelCard.load(model_dir / "README.md")
        assert {r.metric_type: r.metric_value for r in card.data.eval_results} == {
            key: arm["final"][key] for key in ("mlm_loss", "mlm_accuracy")}
        assert {r.dataset_split for r in card.data.eval_results} == {"heldout"}
        assert f"| learning_rate | {arm['learning_rate']} |" in card.text
    assert ModelCard.load(run_dir / "bertkit" / "model" / "README.md").data.eval_results
    summary = result["summary"]
    plain = {n: a for n, a in result["arms"].items() if n != "bertkit"}
    best = min(plain, key=lambda n: plain[n]["final"]["mlm_loss"])
    assert summary["best_plain"] == best
    reached = time_to_reach(result["arms"]["bertkit"]["curve"], plain[best]["final"]["mlm_loss"])
    assert summary["bertkit_seconds_to_target"] == reached
    if reached is not None:
        assert summary["time_ratio"] == pytest.approx(reached / (BUDGET_MINUTES * 60))
    assert json.loads((run_dir / RESULT_FILE).read_text())["summary"] == summary
    assert (run_dir / FIGURE_FILE).stat().st_size > 0


@pytest.mark.slow
def test_a_rerun_keeps_the_arms_already_done(tmp_path, fake_time, monkeypatch):
    run_dir = tmp_path / "bench"
    first = benchmark_pretrain_quality(bench_config(tmp_path), run_dir)

    def must_not_run(*args, **kwargs):
        raise AssertionError("an arm that was done ran again")

    monkeypatch.setattr(pretrain_quality, "_bertkit_arm", must_not_run)
    monkeypatch.setattr(pretrain_quality, "_plain_arm", must_not_run)
    again = benchmark_pretrain_quality(bench_config(tmp_path), run_dir)
    assert again["arms"] == first["arms"]


@pytest.mark.parametrize(("override", "message"), [
    ({"budget.minutes": "null"}, "budget.minutes"),
    ({"objective": "mlm_nsp"}, "objective=mlm"),
    ({"bench.plain.learning_rates": "[]"}, "bench.plain.learning_rates"),
    ({"heldout.fraction": 0}, "heldout.fraction"),
])
def test_settings_the_comparison_needs_are_refused_otherwise(tmp_path, override, message):
    with pytest.raises(BertkitError, match=message):
        benchmark_pretrain_quality(bench_config(tmp_path, **override), tmp_path / "bench")
