"""collect_runs on a sweep tree shaped like the one Hydra and bertkit leave on disk."""

import json
from pathlib import Path

import pytest

from bertkit.errors import BertkitError
from bertkit.reporting.results import FailedRun, collect_runs


def hyperparameters(lr, batch, epochs, seed):
    return {"learning_rate": lr, "lr_scheduler_type": "linear", "warmup_ratio": 0.1,
            "warmup_steps": 0.1, "weight_decay": 0.01, "train_batch_size": batch,
            "per_device_train_batch_size": batch, "num_train_epochs": epochs,
            "max_steps": -1, "max_seq_length": 128, "seed": seed, "num_parameters": 4386178}


def glue_metrics(task, seed, validation, lr=2e-5, batch=32, epochs=3, recipe="glue"):
    main_metric = "f1" if task in ("mrpc", "squad_v1") else "accuracy"
    return {"recipe": recipe, "task": task, "model": "bert-base-uncased", "seed": seed,
            "main_metric": main_metric,
            "main_value": next(iter(validation.values()))[main_metric],
            "validation": validation,
            "train": {"loss": 0.4, "steps": 100, "seconds": 12.5, "examples": 3668},
            "hyperparameters": hyperparameters(lr, batch, epochs, seed)}


def write(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data, indent=2))


@pytest.fixture
def sweep(tmp_path):
    stamp = tmp_path / "multirun" / "glue" / "2026-01-01_00-00-00"
    write(stamp / "mrpc" / "0" / "metrics.json",
          glue_metrics("mrpc", 1, {"validation": {"accuracy": 0.84, "f1": 0.88}}))
    # epochs written as 3.0 by one job and 3 by another: the same grid point
    write(stamp / "mrpc" / "1" / "metrics.json",
          glue_metrics("mrpc", 2, {"validation": {"accuracy": 0.82, "f1": 0.87}}, epochs=3.0))
    write(stamp / "mrpc" / "0" / "checkpoints" / "checkpoint-10" / "trainer_state.json", {})
    write(stamp / "mrpc" / "2" / "failed.json", {"error": "task.data_dir: no such directory"})
    write(stamp / "mnli" / "0" / "metrics.json",
          glue_metrics("mnli", 1, {"validation_matched": {"accuracy": 0.84},
                                   "validation_mismatched": {"accuracy": 0.83}},
                       lr=3e-5, batch=16, epochs=2))
    # a pretraining run with its downstream finetune: the finetune is a run of its arm
    seed42 = tmp_path / "multirun" / "pretrain_ablation" / "s" / "dynamic-mlm_nsp" / "seed42"
    write(seed42 / "metrics.json",
          {"recipe": "pretrain_ablation", "corpus": "wikitext2", "objective": "mlm_nsp",
           "masking": "dynamic", "seed": 42, "train": {"loss": 7.7},
           "hyperparameters": hyperparameters(1e-3, 32, 3.0, 42),
           "downstream": {"rte": {"main_metric": "accuracy", "main_value": 0.53,
                                  "validation": {"validation": {"accuracy": 0.53}}}}})
    write(seed42 / "downstream" / "rte" / "metrics.json",
          glue_metrics("rte", 42, {"validation": {"accuracy": 0.53}}))
    # SQuAD writes its validation scores flat
    squad = glue_metrics("squad_v1", 42, {"validation": {"f1": 88.5}}, recipe="squad")
    squad["validation"] = {"exact_match": 81.0, "f1": 88.5}
    write(tmp_path / "outputs" / "squad" / "squad_v1" / "t" / "metrics.json", squad)
    return tmp_path


def test_collect_runs_reads_finished_and_failed_jobs(sweep):
    runs, failed = collect_runs(sweep)
    stamp = sweep / "multirun" / "glue" / "2026-01-01_00-00-00"
    seed42 = sweep / "multirun" / "pretrain_ablation" / "s" / "dynamic-mlm_nsp" / "seed42"
    assert [r.run_dir for r in runs] == [stamp / "mnli" / "0", stamp / "mrpc" / "0",
                                         stamp / "mrpc" / "1",
                                         seed42 / "downstream" / "rte",
                                         sweep / "outputs" / "squad" / "squad_v1" / "t"]
    assert failed == [FailedRun(stamp / "mrpc" / "2", "task.data_dir: no such directory")]
    mnli, mrpc0, mrpc1, rte, squad = runs
    # named after its pretraining arm, so that the ablation's arms are rows of the table
    assert (rte.recipe, rte.model, rte.task, rte.seed, rte.main_value) == (
        "pretrain_ablation (dynamic masking, mlm_nsp)", "pretrained on wikitext2", "rte", 42,
        0.53)
    assert (mrpc0.recipe, mrpc0.task, mrpc0.seed, mrpc0.main_metric, mrpc0.main_value) == (
        "glue", "mrpc", 1, "f1", 0.88)
    assert mrpc0.model == "bert-base-uncased"
    assert mrpc0.grid_point == mrpc1.grid_point == (2e-5, 32, 3.0)
    assert hash(mrpc0.grid_point) == hash((2e-5, 32, 3.0))
    assert mnli.grid_point == (3e-5, 16, 2.0)
    assert mrpc0.metrics == {"validation/accuracy": 0.84, "validation/f1": 0.88}
    assert mnli.metrics == {"validation_matched/accuracy": 0.84,
                            "validation_mismatched/accuracy": 0.83}
    assert squad.metrics == {"validation/exact_match": 81.0, "validation/f1": 88.5}


def test_collect_runs_on_one_run_directory(sweep):
    one = sweep / "multirun" / "glue" / "2026-01-01_00-00-00" / "mrpc" / "1"
    runs, failed = collect_runs(one)
    assert [(r.task, r.seed) for r in runs] == [("mrpc", 2)] and failed == []


def test_malformed_metrics_name_the_file(sweep):
    bad = sweep / "multirun" / "glue" / "2026-01-01_00-00-00" / "mrpc" / "1" / "metrics.json"
    bad.write_text('{"task": "mrpc", ')
    with pytest.raises(BertkitError, match="mrpc/1/metrics.json: not valid JSON"):
        collect_runs(sweep)
    data = glue_metrics("mrpc", 2, {"validation": {"f1": 0.87}})
    del data["hyperparameters"]["num_train_epochs"]
    write(bad, data)
    with pytest.raises(BertkitError, match=r"metrics.json: hyperparameters.num_train_epochs"):
        collect_runs(sweep)
    write(bad, [1, 2])
    with pytest.raises(BertkitError, match="expected a JSON object"):
        collect_runs(sweep)


def test_malformed_failed_json_and_missing_root(tmp_path):
    write(tmp_path / "job" / "failed.json", {"message": "x"})
    with pytest.raises(BertkitError, match="failed.json: missing string key 'error'"):
        collect_runs(tmp_path)
    with pytest.raises(BertkitError, match="no such directory"):
        collect_runs(tmp_path / "nowhere")
