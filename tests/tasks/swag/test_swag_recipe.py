"""recipe=swag end to end on generated SWAG-format CSV files with a tiny BERT: the files it
writes, an accuracy equal to the one recomputed from the prediction file, resuming from a
checkpoint, the paper's defaults in the composed config, and the errors a user meets first."""

from __future__ import annotations

import csv
import json

import pytest
from safetensors.torch import load_file

from bertkit.errors import BertkitError
from bertkit.jobs import run_job
from bertkit.training.trainer import BertkitTrainer
from tests.conftest import compose_config
from tests.swag_fixtures import make_rows, write_swag_csv, write_vocab


@pytest.fixture
def swag_files(tmp_path):
    return write_swag_files(tmp_path)


def write_swag_files(directory):
    train = write_swag_csv(directory / "data" / "train.csv", make_rows(40, seed=1))
    dev = write_swag_csv(directory / "data" / "val.csv", make_rows(24, seed=2))
    return train, dev


def swag_overrides(train, dev, tmp_path, **extra) -> list[str]:
    overrides = {
        "recipe": "swag",
        "task.train_file": str(train),
        "task.validation_file": str(dev),
        "task.max_seq_length": 32,
        "model": "scratch_tiny",
        "model.tokenizer": str(write_vocab(tmp_path / "vocab")),
        "model.config.hidden_size": 32,
        "model.config.intermediate_size": 64,
        "logger": "none",
        "cache_dir": str(tmp_path / "cache"),
        "trainer.max_steps": 6,
        "trainer.per_device_train_batch_size": 8,
        "trainer.per_device_eval_batch_size": 8,
        "trainer.learning_rate": 1e-3,
        "trainer.eval_strategy": "steps",
        "trainer.eval_steps": 3,
        "trainer.save_strategy": "no",
        "trainer.logging_steps": 1,
        "trainer.disable_tqdm": True,
        **extra,
    }
    return [f"{key}={value}" for key, value in overrides.items()]


def read_tsv(path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle, delimiter="\t"))


def test_tiny_finetune_writes_predictions_whose_accuracy_is_the_reported_one(swag_run):
    run_dir, summary, dev = swag_run

    assert json.loads((run_dir / "metrics.json").read_text()) == summary
    rows = read_tsv(run_dir / "predictions" / "validation.tsv")
    with open(dev, newline="") as handle:
        source = list(csv.DictReader(handle))
    assert len(rows) == len(source) == 24
    # One row per dev example, in file order, with the file's identifiers and gold labels.
    assert [r["index"] for r in rows] == [str(i) for i in range(24)]
    assert [r["fold-ind"] for r in rows] == [s["fold-ind"] for s in source]
    assert [r["video-id"] for r in rows] == [s["video-id"] for s in source]
    assert [r["label"] for r in rows] == [s["label"] for s in source]
    for row in rows:
        probs = [float(row[f"prob{k}"]) for k in range(4)]
        assert sum(probs) == pytest.approx(1.0, abs=1e-5)
        assert int(row["prediction"]) == max(range(4), key=probs.__getitem__)
    correct = sum(r["prediction"] == r["label"] for r in rows)
    assert summary["validation"] == {"validation": {"accuracy": correct / 24,
                                                    "correct": correct, "examples": 24}}
    assert summary["test"] == {} and summary["family"] == "swag"
    assert summary["files"] == {"predictions": str(run_dir / "predictions" / "validation.tsv")}
    assert summary["main_metric"] == "accuracy"
    assert summary["main_value"] == correct / 24
    assert summary["recipe"] == "swag" and summary["task"] == "swag"
    assert summary["train"]["steps"] == 6 and summary["train"]["examples"] == 40
    assert summary["train"]["loss"] > 0 and summary["train"]["seconds"] > 0
    hyper = summary["hyperparameters"]
    assert (hyper["learning_rate"], hyper["max_seq_length"], hyper["num_choices"],
            hyper["per_device_train_batch_size"], hyper["hidden_size"]) == (1e-3, 32, 4, 8, 32)
    config = json.loads((run_dir / "model" / "config.json").read_text())
    assert config["architectures"] == ["BertForMultipleChoice"]
    assert (run_dir / "model" / "tokenizer_config.json").is_file()
    assert "family: swag" in (run_dir / "config.yaml").read_text()


def test_resume_continues_from_the_last_checkpoint(swag_files, tmp_path, monkeypatch):
    train, dev = swag_files
    run_dir = tmp_path / "run"
    saving = {"trainer.save_strategy": "steps", "trainer.save_steps": 2,
              "trainer.eval_strategy": "no", "keep_checkpoints": True}
    run_job(compose_config(swag_overrides(train, dev, tmp_path, **saving,
                                                **{"trainer.max_steps": 4})), run_dir)
    at_four = load_file(run_dir / "checkpoints" / "checkpoint-4" / "model.safetensors")

    steps = []
    original = BertkitTrainer.training_step
    monkeypatch.setattr(BertkitTrainer, "training_step",
                        lambda self, *a, **k: steps.append(1) or original(self, *a, **k))
    summary = run_job(compose_config(swag_overrides(
        train, dev, tmp_path, **saving, **{"trainer.max_steps": 6, "resume": True})), run_dir)
    assert len(steps) == 2 and summary["train"]["steps"] == 6  # steps 5 and 6 only
    final = load_file(run_dir / "model" / "model.safetensors")
    assert final.keys() == at_four.keys()
    assert any(not final[name].equal(at_four[name]) for name in final)  # it trained on


def test_paper_defaults_compose():
    cfg = compose_config(["recipe=swag"])
    assert (cfg.recipe.name, cfg.recipe.job, cfg.recipe.task_family, cfg.task.family) == (
        "swag", "finetune", "swag", "swag")
    trainer = cfg.trainer
    assert (trainer.learning_rate, trainer.per_device_train_batch_size,
            trainer.num_train_epochs) == (2e-5, 16, 3)
    assert (trainer.warmup_steps, trainer.weight_decay, trainer.max_grad_norm) == (0.1, 0.01, 1.0)
    assert cfg.task.max_seq_length == 128 and cfg.task.main_metric == "accuracy"
    assert cfg.model.name_or_path == "bert-base-uncased"
    assert (cfg.task.hub.path, cfg.task.hub.name) == ("allenai/swag", "regular")
    assert dict(cfg.task.files) == {"train": "train.csv", "validation": "val.csv"}
    assert compose_config(["recipe=swag", "trainer.learning_rate=5e-5"]).trainer.learning_rate \
        == 5e-5


@pytest.mark.parametrize(("recipe", "task", "message"), [
    ("swag", "mrpc", "task=mrpc is a glue task, but recipe=swag runs swag tasks"),
    ("glue", "swag", "task=swag is a swag task, but recipe=glue runs glue tasks"),
])
def test_a_task_of_another_family_is_refused(recipe, task, message):
    with pytest.raises(BertkitError, match=message):
        run_job(compose_config([f"recipe={recipe}", f"task={task}"]))


def test_a_bad_row_stops_the_run_before_training(swag_files, tmp_path):
    train, dev = swag_files
    lines = dev.read_text().splitlines()
    lines[5] = lines[5][:lines[5].rindex(",")] + ",7"
    dev.write_text("\n".join(lines) + "\n")
    run_dir = tmp_path / "run"
    with pytest.raises(BertkitError, match=r"val.csv, line 6, column 'label': 7 is outside"):
        run_job(compose_config(swag_overrides(train, dev, tmp_path)), run_dir)
    assert not (run_dir / "metrics.json").exists()


def test_hub_data_without_network_points_to_the_csv_files(tmp_path, hub_offline):
    cfg = compose_config(["recipe=swag", "logger=none", "model=scratch_tiny",
                          f"model.tokenizer={write_vocab(tmp_path / 'vocab')}",
                          f"cache_dir={tmp_path / 'cache'}"])
    with pytest.raises(BertkitError, match=r"allenai/swag/regular.*task.train_file=<path to "
                                           r"train.csv> task.validation_file=<path to val.csv>"):
        run_job(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.json").exists()


def test_settings_are_checked_before_any_data_is_read(tmp_path):
    cfg = compose_config(["recipe=swag", "task.max_seq_length=3", "logger=none",
                          f"task.train_file={tmp_path / 'absent.csv'}"])
    with pytest.raises(BertkitError, match=r"task.max_seq_length=3: expected an integer of at "
                                           r"least 4"):
        run_job(cfg, tmp_path / "run")


def test_offline_wandb_run_holds_the_paper_settings_and_final_accuracy(swag_run):
    from tests.wandb_records import read_offline_run

    run_dir, summary, _ = swag_run
    (offline,) = (run_dir / "wandb").glob("offline-run-*")
    logged = read_offline_run(offline)
    config = logged["config"]
    assert (config["learning_rate"], config["max_seq_length"], config["num_choices"],
            config["train_batch_size"], config["seed"]) == (1e-3, 32, 4, 8, 5)
    assert config["bertkit"]["task"]["family"] == "swag"
    assert logged["group"] == "swag-swag"
    assert {"recipe:swag", "task:swag", "seed:5"} <= set(logged["tags"])
    assert "train/loss" in logged["summary"] and "eval/accuracy" in logged["summary"]
    assert logged["summary"]["final/validation/accuracy"] == pytest.approx(
        summary["validation"]["validation"]["accuracy"])


def test_a_main_metric_swag_does_not_report_is_refused_before_any_data_is_read(tmp_path):
    with pytest.raises(BertkitError, match=r"^task.main_metric='f1': SWAG reports accuracy$"):
        run_job(compose_config(["recipe=swag", "task.main_metric=f1", "logger=none",
                                f"task.data_dir={tmp_path / 'absent'}"]), tmp_path / "run")
