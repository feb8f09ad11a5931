"""The bench_parity recipe: the plain way is run_glue.py's recipe with the same hyperparameters
(checked by making the two ways train the very same model), the bertkit way is a normal run, and
the statistics are bertkit-report's."""

from __future__ import annotations

import json

import numpy as np
import pytest
from transformers import BertConfig, BertModel, BertTokenizerFast

from benchmarks.command import compose_config as compose_benchmark
from benchmarks.glue_parity import JOB, benchmark_glue_parity
from bertkit.errors import BertkitError
from bertkit.jobs import run_job as run_bertkit_job
from bertkit.reporting.collect import collect_runs
from bertkit.reporting.statistics import (
    aso_epsilon,
    bootstrap_difference_ci,
    compare_groups,
    seeds_needed,
    summarize,
)


def compose_config(overrides: list[str], with_hydra: bool = False):
    """The config `python -m benchmarks.glue_parity <overrides>` runs."""
    return compose_benchmark("bench_parity", overrides, with_hydra)


def run_job(cfg, run_dir=None) -> dict:
    """What `python -m benchmarks.glue_parity` runs: bertkit's run_job, the
    benchmark's job."""
    return run_bertkit_job(cfg, run_dir, job=JOB)


@pytest.fixture
def checkpoint(tmp_path, vocab_dir):
    """A tiny pretrained-style checkpoint: BertModel weights and a tokenizer, no task head."""
    directory = tmp_path / "checkpoint"
    tokenizer = BertTokenizerFast(vocab_file=str(vocab_dir / "vocab.txt"))
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                        num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=64)
    BertModel(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def parity_overrides(data_dir, checkpoint, **extra) -> list[str]:
    overrides = {
        "task": "mrpc",
        "task.data_dir": str(data_dir),
        "task.max_seq_length": 32,
        "model.name_or_path": str(checkpoint),
        "parity.baseline_max_length": 48,
        "parity.seeds": "[3,1]",
        "trainer.num_train_epochs": 2,
        "trainer.per_device_train_batch_size": 8,
        "trainer.per_device_eval_batch_size": 8,
        "trainer.learning_rate": 1e-3,
        "trainer.logging_steps": 1,
        **extra,
    }
    return [f"{key}={value}" for key, value in overrides.items()]


@pytest.mark.slow
@pytest.mark.parametrize("padding", ["max_length", "longest"])
def test_both_ways_train_the_same_model_when_only_padding_differs(glue_dir, checkpoint, tmp_path,
                                                                  padding):
    """With dropout off and bertkit's batches drawn at random as run_glue.py draws them, the only
    difference left is padding (to 48, or to each batch's longest as run_glue.py's
    --pad_to_max_length False, vs bertkit's), which the attention mask hides: a plain way with
    other hyperparameters, another init or another order would differ."""
    cfg = compose_config(parity_overrides(
        glue_dir("mrpc", n_train=24, n_dev=12), checkpoint,
        **{"model.hidden_dropout_prob": 0.0, "model.attention_probs_dropout_prob": 0.0,
           "trainer.train_sampling_strategy": "random", "parity.baseline_padding": padding}))

    result = benchmark_glue_parity(cfg, run_dir=tmp_path / "run")

    for seed in ("3", "1"):
        plain = result["ways"]["plain"]["per_seed"][seed]
        bertkit = result["ways"]["bertkit"]["per_seed"][seed]
        assert plain["steps"] == bertkit["steps"] == 6  # 24 examples / 8 x 2 epochs
        assert plain["training_loss"] == pytest.approx(bertkit["training_loss"], abs=1e-4)
        assert plain["validation"] == pytest.approx(bertkit["validation"], abs=1e-6)
    seeds = result["ways"]["plain"]["per_seed"]
    assert seeds["3"]["training_loss"] != pytest.approx(seeds["1"]["training_loss"], abs=1e-4)
    assert "train_sampling_strategy=random" in result["ways"]["bertkit"]["description"]
    assert f"padding={padding}" in result["ways"]["plain"]["description"]
    assert result["baseline_padding"] == padding


@pytest.mark.slow
def test_result_holds_each_way_statistics_and_bertkit_runs_report_like_any_run(
        glue_dir, checkpoint, tmp_path):
    cfg = compose_config(parity_overrides(glue_dir("mrpc", n_train=24, n_dev=12), checkpoint))
    run_dir = tmp_path / "run"

    result = run_job(cfg, run_dir)

    assert json.loads((run_dir / "parity.json").read_text()) == result
    assert result["seeds"] == [3, 1] and result["main_metric"] == "f1"
    scores = {way: [result["ways"][way]["per_seed"][seed]["validation"]["f1"]
                    for seed in ("3", "1")] for way in ("plain", "bertkit")}
    for way in ("plain", "bertkit"):
        assert result["ways"][way]["main"] == summarize(scores[way])
    assert result["comparison"] == compare_groups(scores["plain"], scores["bertkit"])
    significance = result["significance"]
    assert significance["aso_epsilon_bertkit_better"] == aso_epsilon(scores["plain"],
                                                                      scores["bertkit"])
    assert significance["aso_epsilon_plain_better"] == aso_epsilon(scores["bertkit"],
                                                                    scores["plain"])
    assert (significance["bootstrap_low"], significance["bootstrap_high"]) == \
        bootstrap_difference_ci(scores["plain"], scores["bertkit"], 0.95)
    assert significance["seeds_needed_per_way"] == seeds_needed(
        float(np.std(scores["plain"], ddof=1)), float(np.std(scores["bertkit"], ddof=1)), 0.01)
    seconds = {way: sum(run["seconds"] for run in result["ways"][way]["per_seed"].values())
               for way in ("plain", "bertkit")}
    assert result["time_ratio"] == pytest.approx(seconds["plain"] / seconds["bertkit"])
    assert result["hyperparameters"]["learning_rate"] == 1e-3
    assert "train_sampling_strategy=random" in result["ways"]["bertkit"]["description"]
    # The bertkit way's seeds are ordinary `recipe=glue` runs of the report.
    runs, failed = collect_runs(run_dir)
    assert not failed
    assert sorted((run.recipe, run.seed) for run in runs) == [("glue", 1), ("glue", 3)]
    assert {run.seed: run.main_value for run in runs} == {
        1: scores["bertkit"][1], 3: scores["bertkit"][0]}


@pytest.mark.parametrize("override, message", [
    ({"parity.seeds": "[1]"}, "at least 2 different seeds"),
    ({"parity.baseline_max_length": 16}, "baseline_max_length=16 is below"),
    ({"model.name_or_path": "null"}, "model.name_or_path is empty"),
    ({"parity.baseline_padding": "do_not_pad"}, "baseline_padding=do_not_pad: expected one of "
                                                "max_length, longest"),
])
def test_settings_the_comparison_cannot_use_are_refused(glue_dir, checkpoint, tmp_path,
                                                        override, message):
    cfg = compose_config(parity_overrides(glue_dir("mrpc"), checkpoint, **override))
    with pytest.raises(BertkitError, match=message):
        benchmark_glue_parity(cfg, run_dir=tmp_path / "run")


@pytest.mark.slow
def test_a_rerun_reuses_finished_seeds_and_refuses_runs_made_under_other_settings(
        glue_dir, checkpoint, tmp_path):
    """Seeds run in separate launches (or side by side) make one table; a seed trained at
    another learning rate must not slip into it."""
    data_dir, run_dir = glue_dir("mrpc", n_train=24, n_dev=12), tmp_path / "run"
    first = benchmark_glue_parity(compose_config(parity_overrides(data_dir, checkpoint)),
                                  run_dir=run_dir)
    # Seed 3's plain run is cut short: its record is gone, so it trains again.
    (run_dir / "plain" / "seed_3" / "parity_run.json").unlink()

    grown = benchmark_glue_parity(compose_config(parity_overrides(
        data_dir, checkpoint, **{"parity.seeds": "[3,1,2]"})), run_dir=run_dir)

    assert grown["seeds"] == [3, 1, 2]
    for way in ("plain", "bertkit"):
        assert set(grown["ways"][way]["per_seed"]) == {"1", "2", "3"}
    # Reused: the very record (its timing too); retrained: same scores, its own timing.
    assert grown["ways"]["bertkit"]["per_seed"]["3"] == first["ways"]["bertkit"]["per_seed"]["3"]
    assert grown["ways"]["plain"]["per_seed"]["1"] == first["ways"]["plain"]["per_seed"]["1"]
    retrained = grown["ways"]["plain"]["per_seed"]["3"]
    before = first["ways"]["plain"]["per_seed"]["3"]
    assert retrained["validation"] == before["validation"]
    assert retrained["seconds"] != before["seconds"]
    scores = [grown["ways"]["plain"]["per_seed"][seed]["validation"]["f1"] for seed in "312"]
    assert grown["ways"]["plain"]["main"] == summarize(scores)

    with pytest.raises(BertkitError, match=r"seed_3/parity_run.json ran under other settings "
                                           r"\(hyperparameters differ"):
        benchmark_glue_parity(compose_config(parity_overrides(
            data_dir, checkpoint, **{"trainer.learning_rate": 5e-4})), run_dir=run_dir)


@pytest.mark.slow
def test_the_two_ways_can_train_in_separate_launches_and_a_last_launch_compares_them(
        glue_dir, checkpoint, tmp_path):
    """parity.ways splits one comparison between processes: each trains its way's seeds (one
    seed is enough for one way), writes no comparison, and the launch with both ways reuses
    them all."""
    data_dir, run_dir = glue_dir("mrpc", n_train=24, n_dev=12), tmp_path / "run"
    plain = benchmark_glue_parity(compose_config(parity_overrides(
        data_dir, checkpoint, **{"parity.ways": "[plain]"})), run_dir=run_dir)
    bertkit = benchmark_glue_parity(compose_config(parity_overrides(
        data_dir, checkpoint, **{"parity.ways": "[bertkit]", "parity.seeds": "[1]"})),
        run_dir=run_dir)
    assert plain["ways"] == ["plain"] and set(plain["runs"]["plain"]) == {3, 1}
    assert plain["runs"]["bertkit"] == {} and bertkit["runs"]["plain"] == {}
    assert set(bertkit["runs"]["bertkit"]) == {1}
    assert not (run_dir / "parity.json").exists()
    assert not (run_dir / "bertkit" / "seed_3").exists()

    both = benchmark_glue_parity(compose_config(parity_overrides(data_dir, checkpoint)),
                                 run_dir=run_dir)
    assert (run_dir / "parity.json").is_file()
    # Plain's two seeds and bertkit's seed 1 are the records of the earlier launches.
    for seed in (3, 1):
        assert both["ways"]["plain"]["per_seed"][str(seed)]["seconds"] == \
            plain["runs"]["plain"][seed]["seconds"]
    assert both["ways"]["bertkit"]["per_seed"]["1"]["seconds"] == \
        bertkit["runs"]["bertkit"][1]["seconds"]
    assert (run_dir / "bertkit" / "seed_3" / "parity_run.json").is_file()


@pytest.mark.parametrize("ways", ["[]", "[plain,plain]", "[bertkit,run_glue]"])
def test_ways_other_than_plain_and_bertkit_are_refused(glue_dir, checkpoint, tmp_path, ways):
    cfg = compose_config(parity_overrides(glue_dir("mrpc"), checkpoint,
                                          **{"parity.ways": ways}))
    with pytest.raises(BertkitError, match=r"parity.ways=.*: expected one or both of plain, "
                                           r"bertkit"):
        benchmark_glue_parity(cfg, run_dir=tmp_path / "run")
