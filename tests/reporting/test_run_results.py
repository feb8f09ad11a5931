"""collect_runs on a sweep tree shaped like the one Hydra and bertkit leave on disk, with
metrics.json files of schema 2 (bertkit.data.metrics_file) and of the older schema 1."""

import json
import re
from pathlib import Path

import pytest

from bertkit.data.metrics_file import metrics_record
from bertkit.errors import BertkitError
from bertkit.reporting.collect import collect_runs
from bertkit.reporting.identity import RowSplit
from bertkit.reporting.results import FailedRun


def hyperparameters(lr, batch, epochs, seed):
    return {"learning_rate": lr, "lr_scheduler_type": "linear", "warmup_ratio": 0.1,
            "warmup_steps": 0.1, "weight_decay": 0.01, "train_batch_size": batch,
            "per_device_train_batch_size": batch, "num_train_epochs": epochs,
            "max_steps": -1, "max_seq_length": 128, "seed": seed, "num_parameters": 4386178}


def glue_metrics(task, seed, validation, lr=2e-5, batch=32, epochs=3, recipe="glue",
                 schema=2, test=None):
    """A metrics.json as bertkit writes it: schema 2 through metrics_file.metrics_record, or
    schema 1 as runs wrote it before (no schema_version, family, test, files, details)."""
    main_metric = "f1" if task in ("mrpc", "squad_v1", "conll2003") else "accuracy"
    header = {"recipe": recipe, "task": task, "model": "bert-base-uncased", "seed": seed,
              "main_metric": main_metric,
              "main_value": next(iter(validation.values()))[main_metric]}
    train = {"loss": 0.4, "steps": 100, "seconds": 12.5, "examples": 3668}
    if schema == 1:
        return {**header, "validation": validation, "train": train,
                "hyperparameters": hyperparameters(lr, batch, epochs, seed)}
    family = {"squad_v1": "squad", "conll2003": "ner"}.get(task, "glue")
    return metrics_record(header={**header, "family": family}, validation=validation,
                          test=test, train={**train, "planned_steps": 100, "complete": True},
                          hyperparameters=hyperparameters(lr, batch, epochs, seed))


def write(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data, indent=2))


@pytest.fixture
def sweep(tmp_path):
    stamp = tmp_path / "multirun" / "glue" / "2026-01-01_00-00-00"
    write(stamp / "mrpc" / "0" / "metrics.json",
          glue_metrics("mrpc", 1, {"validation": {"accuracy": 0.84, "f1": 0.88}}))
    # epochs written as 3.0 by one job and 3 by another: the same grid point; this job's
    # metrics.json is of schema 1
    write(stamp / "mrpc" / "1" / "metrics.json",
          glue_metrics("mrpc", 2, {"validation": {"accuracy": 0.82, "f1": 0.87}}, epochs=3.0,
                       schema=1))
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
    # SQuAD wrote its validation scores flat in schema 1
    squad = glue_metrics("squad_v1", 42, {"validation": {"f1": 88.5}}, recipe="squad",
                         schema=1)
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
    # a finetune of its pretraining arm: the arm's settings make its row
    assert (rte.recipe, rte.model, rte.task, rte.seed, rte.main_value) == (
        "pretrain_ablation", "pretrained on wikitext2", "rte", 42, 0.53)
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


def unreadable(root, runs_expected: int) -> str:
    """The one failed run collect_runs reports for a bad file, beside the other runs."""
    runs, failed = collect_runs(root)
    assert len(runs) == runs_expected
    (bad,) = [f for f in failed if f.error.startswith("unreadable")]
    return bad.error


def test_malformed_metrics_name_the_file_and_spare_the_others(sweep):
    """A bad metrics.json is a failed run whose error names the file; the others are read."""
    others = len(collect_runs(sweep)[0]) - 1
    bad = sweep / "multirun" / "glue" / "2026-01-01_00-00-00" / "mrpc" / "1" / "metrics.json"
    bad.write_text('{"task": "mrpc", ')
    assert re.search("mrpc/1/metrics.json: not valid JSON", unreadable(sweep, others))
    data = glue_metrics("mrpc", 2, {"validation": {"f1": 0.87}})
    del data["hyperparameters"]["num_train_epochs"]
    write(bad, data)
    assert re.search(r"metrics.json: hyperparameters.num_train_epochs",
                     unreadable(sweep, others))
    write(bad, [1, 2])
    assert "metrics.json: expected a JSON object, found array" in unreadable(sweep, others)


def test_malformed_failed_json_and_missing_root(tmp_path):
    write(tmp_path / "job" / "failed.json", {"message": "x"})
    assert "failed.json: missing string key 'error'" in unreadable(tmp_path, 0)
    with pytest.raises(BertkitError, match="no such directory"):
        collect_runs(tmp_path / "nowhere")


def test_schema_2_test_splits_are_never_dev_scores(tmp_path):
    """CoNLL-2003 scores its labelled test split too: schema 2 keeps it in "test", and the
    report neither lists it among the run's dev scores nor ranks by it, even where it is the
    higher number. A schema-2 SQuAD file reads as its schema-1 form did."""
    from bertkit.reporting.writer import build_report

    for seed, (dev, test) in enumerate([(0.90, 0.97), (0.80, 0.99)], start=1):
        write(tmp_path / "ner" / str(seed) / "metrics.json",
              glue_metrics("conll2003", seed, {"validation": {"f1": dev, "precision": 0.5}},
                           lr=2e-5 * seed, recipe="ner", test={"test": {"f1": test}}))
    new_squad = glue_metrics("squad_v1", 1, {"validation": {"exact_match": 81.0, "f1": 88.5}},
                             recipe="squad")
    write(tmp_path / "squad" / "new" / "metrics.json", new_squad)
    old_squad = {**glue_metrics("squad_v1", 1, {"validation": {"f1": 88.5}}, recipe="squad",
                                schema=1), "validation": {"exact_match": 81.0, "f1": 88.5}}
    write(tmp_path / "squad" / "old" / "metrics.json", old_squad)

    runs, failed = collect_runs(tmp_path)
    ner1, ner2, squad_new, squad_old = runs
    assert failed == [] and json.loads((tmp_path / "ner" / "1" / "metrics.json").read_text())[
        "test"] == {"test": {"f1": 0.97}}
    assert ner1.metrics == {"validation/f1": 0.90, "validation/precision": 0.5}
    assert (ner1.main_value, ner2.main_value) == (0.90, 0.80)
    assert squad_new.metrics == squad_old.metrics == {"validation/exact_match": 81.0,
                                                      "validation/f1": 88.5}
    best = build_report(tmp_path, reference_keys=["none"])["systems"]
    (ner_system,) = [s for s in best if s["recipe"] == "ner"]
    assert ner_system["tasks"]["conll2003"]["values"] == [0.90]  # seed 1's dev, not a test f1
    assert ner_system["tasks"]["conll2003"]["grid_point"]["learning_rate"] == 2e-5


def test_a_schema_version_this_bertkit_cannot_read_names_the_file(tmp_path):
    for version in ("2", 2.0, 0, True, 3):
        data = {**glue_metrics("rte", 1, {"validation": {"accuracy": 0.5}}),
                "schema_version": version}
        write(tmp_path / "rte" / "metrics.json", data)
        assert re.search(r"rte/metrics.json: schema_version .*: expected a whole number from 1 "
                         r"to 2", unreadable(tmp_path, 0))


def row_names(runs) -> dict[str, list[float]]:
    split = RowSplit.of(runs)
    rows: dict[str, list[float]] = {}
    for run in runs:
        rows.setdefault(split.name(run), []).append(run.main_value)
    return rows


def test_each_finetuning_method_is_its_own_system(tmp_path):
    """Runs of one sweep over finetuning=full,llrd are two rows of the report, not one, named
    by the method (its decay comes with it); a run that records no method cannot be told
    apart, so it is a row of its own."""
    decay = {"full": 1.0, "llrd": 0.95}
    for method, seed, f1 in (("full", 1, 0.88), ("llrd", 1, 0.89), (None, 2, 0.87)):
        record = glue_metrics("mrpc", seed, {"validation": {"accuracy": 0.8, "f1": f1}})
        if method is not None:
            record["hyperparameters"]["finetuning"] = {"name": method,
                                                       "layer_lr_decay": decay[method]}
        write(tmp_path / f"{method}-{seed}" / "metrics.json", record)
    runs, _ = collect_runs(tmp_path)
    assert row_names(runs) == {"bert-base-uncased · finetuning=full": [0.88],
                               "bert-base-uncased · finetuning=llrd": [0.89],
                               "bert-base-uncased · finetuning=?": [0.87]}
    split = RowSplit.of(runs)
    assert split.unknown == ("finetuning.layer_lr_decay", "finetuning.name")
    assert split.unrecorded_runs == 1


def test_a_sweep_over_a_methods_setting_is_one_system_per_value(tmp_path):
    """finetuning=llrd finetuning.layer_lr_decay=0.95,0.9 seed=1,2: two systems of two seeds
    each, not one averaged over both values; the decay, which differs within llrd, is named."""
    cases = [("llrd", 0.95, 1, 0.80), ("llrd", 0.95, 2, 0.82), ("llrd", 0.9, 1, 0.70),
             ("llrd", 0.9, 2, 0.72), ("full", 0.8, 1, 0.60)]
    for name, decay, seed, f1 in cases:
        record = glue_metrics("mrpc", seed, {"validation": {"accuracy": 0.8, "f1": f1}})
        record["hyperparameters"]["finetuning"] = {
            "name": name, "layer_lr_decay": decay, "freeze_layers": 0,
            "lora": {"enabled": False}, "intermediate": {"task": None}}
        write(tmp_path / f"{name}-{decay}-{seed}" / "metrics.json", record)
    runs, _ = collect_runs(tmp_path)
    assert row_names(runs) == {
        "bert-base-uncased · finetuning=llrd · layer_lr_decay=0.95": [0.80, 0.82],
        "bert-base-uncased · finetuning=llrd · layer_lr_decay=0.9": [0.70, 0.72],
        "bert-base-uncased · finetuning=full · layer_lr_decay=0.8": [0.60]}
