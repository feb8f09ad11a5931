"""bertkit-report from W&B run logs when the run directories (their metrics.json) are gone:
a real sweep through the CLI with W&B offline, and fabricated offline runs for the failures."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
from omegaconf import OmegaConf

from bertkit.config_schema import input_keys
from bertkit.errors import BertkitError
from bertkit.reporting.cli import main
from bertkit.reporting.collect import collect_runs
from bertkit.reporting.identity import NEUTRAL_FILE
from bertkit.reporting.results import FailedRun, RunResult
from bertkit.reporting.wandb_log import find_log
from bertkit.reporting.writer import build_report
from tests.reporting.test_run_results import glue_metrics, write
from tests.reporting.test_wandb_offline_log import offline_run
from tests.test_cli import run_cli


def bertkit_config(task="mnli", seed=1, lr=2e-5, family="glue", main_metric="accuracy",
                   job="finetune", schema=2):
    """The W&B config of a bertkit run: paper hyperparameters by plain name + "bertkit", the
    resolved config. schema 2: recipe.job and task.family, as runs write it now; schema 1:
    recipe.family (glue, squad, swag, ner, pretrain), as older runs wrote it."""
    if schema == 1:
        recipe, task_config = {"name": family, "family": family}, {}
    else:
        recipe = {"name": family, "job": job, "task_family": family, "dataset": task}
        task_config = {"family": family}
    return {"learning_rate": lr, "train_batch_size": 32, "num_train_epochs": 3.0, "seed": seed,
            "warmup_ratio": 0.1, "num_parameters": 4386178,
            "bertkit": {"recipe": recipe,
                        "task": {"name": task, "main_metric": main_metric, **task_config},
                        "model": {"name_or_path": "bert-base-uncased"}, "seed": seed}}


def final_summary(scores: dict, main_metric: str, main_value: float, steps=120) -> dict:
    """The summary finish_wandb writes (final/..., main_metric/value, progress) plus Trainer's
    own train/global_step."""
    return {**{f"final/{key}": value for key, value in scores.items()},
            "main_metric": main_metric, "main_value": main_value, "num_parameters": 4386178,
            "train/complete": True, "train/planned_steps": steps, "train/global_step": steps}


MNLI_SCORES = {"validation_matched/accuracy": 0.8125, "validation_matched/loss": 0.5,
               "validation_mismatched/accuracy": 0.75}


@pytest.mark.slow  # runs
def test_finished_failed_and_unfinished_runs(tmp_path):
    """Logs of older runs: recipe.family in the config, SQuAD's flat final/<metric>."""
    root = tmp_path / "outputs"
    good = offline_run(root / "mnli-seed1", bertkit_config(seed=1, schema=1),
                       final_summary(MNLI_SCORES, "accuracy", 0.8125))
    crashed = offline_run(root / "mnli-seed2", bertkit_config(seed=2, schema=1),
                          {"train/global_step": 40}, exit_code=1)
    no_score = offline_run(root / "mnli-seed3", bertkit_config(seed=3, schema=1),
                           {"train/loss": 0.9})
    # a run killed while running: its log has no exit record yet
    killed_job = root / "mnli-seed4"
    shutil.copytree(good.parent.parent, killed_job)
    (killed,) = (killed_job / "wandb").glob("offline-run-*")
    log = find_log(killed)
    log.write_bytes(log.read_bytes()[:-1])
    # CoNLL-2003 scores its test split too (not a dev score); older SQuAD runs wrote flat
    # final/<metric>
    ner = offline_run(root / "ner", bertkit_config("conll2003", 5, family="ner",
                                                   main_metric="f1", schema=1),
                      final_summary({"validation/f1": 0.9, "test/f1": 0.85}, "f1", 0.9))
    squad = offline_run(root / "squad", bertkit_config("squad_v1", 6, family="squad",
                                                       main_metric="f1", schema=1),
                        final_summary({"f1": 88.25, "exact_match": 81.0}, "f1", 88.25))

    runs, failed = collect_runs(root, source="auto")
    assert [r.run_dir for r in runs] == [good, ner, squad]
    assert runs[0] == RunResult(
        run_dir=good, recipe="glue", task="mnli", model="bert-base-uncased", seed=1,
        main_metric="accuracy", main_value=0.8125, grid_point=(2e-5, 32, 3.0),
        metrics=MNLI_SCORES, steps=120, planned_steps=120, complete=True, source="wandb",
        settings=runs[0].settings, settings_source="W&B config", config=runs[0].config)
    assert runs[0].settings["model.name_or_path"] == "bert-base-uncased"
    assert runs[1].metrics == {"validation/f1": 0.9}
    assert runs[2].metrics == {"validation/f1": 88.25, "validation/exact_match": 81.0}
    assert failed == [
        FailedRun(crashed, "failed (mnli seed 2): the W&B run exited with code 1"),
        FailedRun(no_score, "failed (mnli seed 3): the W&B run ended without a main_value in "
                            "its summary (the job stopped before its final evaluation)"),
        FailedRun(killed, "unfinished (mnli seed 1): the W&B log has no exit record (the job "
                          "is still running, or was killed)")]
    # --source files sees none of it
    assert collect_runs(root, source="files") == ([], [])
    assert main([str(root), "--source", "files", "--reference", "none"]) == 2

    # the report lists them as failed jobs
    assert main([str(root), "--reference", "none"]) == 0
    md = (root / "report" / "report.md").read_text(encoding="utf-8")
    assert "3 finished run(s) and 3 failed job(s) under" in md
    assert "runs read 3 from W&B run logs (--source auto)." in md
    assert ("- `mnli-seed2/wandb/" + crashed.name
            + "`: failed (mnli seed 2): the W&B run exited with code 1") in md


def test_new_runs_recipe_job_says_what_is_a_finetune(tmp_path):
    """Logs of new runs: recipe.job says whether a run is a finetune, whatever its summary. A
    finetune that stopped before its final evaluation (no main_value: nothing else tells) is
    a failed job; a pretraining job, its downstream finetunes and a benchmark (even one with a
    main_value) are no result. Every family logs final/<split>/<metric>, SQuAD included; test
    splits are no dev scores."""
    root = tmp_path / "outputs"
    squad = offline_run(root / "squad", bertkit_config("squad_v1", 1, family="squad",
                                                       main_metric="f1"),
                        final_summary({"validation/f1": 88.25, "validation/exact_match": 81.0},
                                      "f1", 88.25))
    ner = offline_run(root / "ner", bertkit_config("conll2003", 2, family="ner",
                                                   main_metric="f1"),
                      final_summary({"validation/f1": 0.9, "test/f1": 0.95}, "f1", 0.9))
    stopped = offline_run(root / "swag", bertkit_config("swag", 3, family="swag"),
                          {"train/global_step": 40})
    pretraining = bertkit_config(family="pretrain", job="pretrain")
    pretraining["bertkit"]["task"] = None  # recipe=pretrain composes no task
    offline_run(root / "pretrain", pretraining, {"train/mlm_loss": 7.5})
    offline_run(root / "pretrain" / "downstream" / "rte", bertkit_config("rte"),
                final_summary({"validation/accuracy": 0.5}, "accuracy", 0.5))
    offline_run(root / "bench", bertkit_config("rte", job="bench_glue"),
                final_summary({"validation/accuracy": 0.5}, "accuracy", 0.5))

    runs, failed = collect_runs(root, source="wandb")
    assert [r.run_dir for r in runs] == [ner, squad]
    assert runs[0].metrics == {"validation/f1": 0.9}
    assert runs[1].metrics == {"validation/f1": 88.25, "validation/exact_match": 81.0}
    assert (runs[1].recipe, runs[1].task, runs[1].seed, runs[1].main_value) == (
        "squad", "squad_v1", 1, 88.25)
    assert failed == [
        FailedRun(stopped, "failed (swag seed 3): the W&B run ended without a main_value in "
                           "its summary (the job stopped before its final evaluation)")]


def test_metrics_json_wins_and_nothing_is_counted_twice(tmp_path):
    root = tmp_path / "outputs"
    job = root / "mnli" / "0"
    offline_run(job, bertkit_config(seed=1), final_summary(MNLI_SCORES, "accuracy", 0.8125))
    write(job / "metrics.json", glue_metrics(
        "mnli", 1, {"validation_matched": {"accuracy": 0.8125},
                    "validation_mismatched": {"accuracy": 0.75}}))
    # a failed job whose W&B run also ended without a score: one failed job, not two
    failed_job = root / "mnli" / "1"
    offline_run(failed_job, bertkit_config(seed=2), {}, exit_code=1)
    write(failed_job / "failed.json", {"error": "CUDA out of memory"})

    for source, origin in (("auto", "metrics.json"), ("files", "metrics.json"),
                           ("wandb", "wandb")):
        runs, failed = collect_runs(root, source=source)
        assert [(r.run_dir.relative_to(root).parts[:2], r.source) for r in runs] == [
            (("mnli", "0"), origin)], source
        assert len(failed) == 1, source
        assert build_report(root, source=source, reference_keys=["none"])["n_runs"] == 1
    # the same numbers either way
    (from_file,), _ = collect_runs(root, source="files")
    (from_wandb,), _ = collect_runs(root, source="wandb")
    assert from_wandb.metrics == {"validation_matched/accuracy": 0.8125,
                                  "validation_matched/loss": 0.5,
                                  "validation_mismatched/accuracy": 0.75}
    assert (from_file.main_value, from_file.grid_point, from_file.seed) == (
        from_wandb.main_value, from_wandb.grid_point, from_wandb.seed)


def test_a_resumed_job_is_one_run_and_pretraining_is_skipped(tmp_path):
    root = tmp_path / "outputs"
    # an interrupted run and its resumption in the same job directory: the finished one counts
    job = root / "rte" / "0"
    first = offline_run(job, bertkit_config("rte"), {"train/global_step": 10}, exit_code=255)
    second = offline_run(job, bertkit_config("rte"),
                         final_summary({"validation/accuracy": 0.625}, "accuracy", 0.625))
    # a pretraining run (no main_value) with its downstream finetune: neither is a result,
    # as with their metrics.json
    pretrain = root / "pretrain" / "seed42"
    offline_run(pretrain, bertkit_config(family="pretrain", schema=1),
                {"train/mlm_loss": 7.5})
    offline_run(pretrain / "downstream" / "rte", bertkit_config("rte", schema=1),
                final_summary({"validation/accuracy": 0.5}, "accuracy", 0.5))

    runs, failed = collect_runs(root, source="auto")
    assert [r.run_dir for r in runs] == [second] and failed == []
    assert first.parent == second.parent
    with pytest.raises(BertkitError, match="no finetuning or pretraining runs found"):
        build_report(root / "pretrain")


@pytest.mark.slow
def test_report_from_wandb_logs_equals_report_from_metrics_json(glue_dir, vocab_dir, tmp_path):
    """A real 2 x 2 sweep through the CLI, W&B offline; then only the W&B directories kept."""
    data = glue_dir("rte", n_dev=24)
    sweep = tmp_path / "sweep"
    result = run_cli("-m", "recipe=glue", "task=rte", f"task.data_dir={data}", "model=scratch_tiny",
                     f"model.tokenizer={vocab_dir}", "model.config.hidden_size=32",
                     "model.config.intermediate_size=64", "model.config.num_hidden_layers=1",
                     "logger=wandb", "logger.mode=offline", "seed=1,2",
                     "trainer.learning_rate=1e-3,3e-3", "trainer.max_steps=2",
                     "trainer.per_device_train_batch_size=8", "trainer.save_strategy=no",
                     "trainer.eval_strategy=no", "trainer.disable_tqdm=true",
                     f"hydra.sweep.dir={sweep}", cwd=tmp_path,
                     env_extra={"WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert len(list(sweep.rglob("metrics.json"))) == 4
    assert len(list(sweep.rglob("run-*.wandb"))) == 4

    from_files = build_report(sweep, source="files", reference_keys=["none"])
    both = build_report(sweep, reference_keys=["none"])  # auto: metrics.json wins
    assert both["n_runs"] == 4 and both["runs_by_source"] == {"metrics.json": 4}

    # Keep nothing but the W&B run directories (metrics.json, model/, config.yaml ... gone)
    kept = tmp_path / "kept"
    for log in sweep.rglob("run-*.wandb"):
        target = kept / log.parent.relative_to(sweep)
        shutil.copytree(log.parent, target)
    assert not list(kept.rglob("metrics.json"))
    from_wandb = build_report(kept, reference_keys=["none"])
    assert from_wandb["runs_by_source"] == {"wandb": 4} and from_wandb["failed"] == []
    assert from_wandb["table_markdown"] == from_files["table_markdown"]
    assert from_wandb["table_csv"] == from_files["table_csv"]
    for a, b in zip(from_files["systems"], from_wandb["systems"], strict=True):
        for task in a["tasks"]:
            assert b["tasks"][task]["values"] == a["tasks"][task]["values"]
            assert b["tasks"][task]["grid_point"] == a["tasks"][task]["grid_point"]
            assert b["tasks"][task]["expected_max"] == a["tasks"][task]["expected_max"]
    # run by run, every field but where it was read from
    runs_files, _ = collect_runs(sweep, source="files")
    runs_wandb, _ = collect_runs(sweep, source="wandb")
    # The W&B config holds the resolved config, as config.yaml does: the same settings, but
    # for the inputs a run reads (the schema's input_keys: data, tokenizer, checkpoint,
    # corpus) and where its data came from (result_neutral.yaml's data_location: data_source,
    # task.max_*_samples), which metrics.json names by their content and the W&B config by
    # their paths and values.
    assert {r.settings_source for r in runs_wandb} == {"W&B config"}
    data_location = OmegaConf.load(NEUTRAL_FILE).data_location
    by_content = {"data.fingerprint", *data_location, *input_keys()}

    def comparable(run):
        settings = {k: v for k, v in run.settings.items() if k not in by_content}
        config = {k: v for k, v in run.config.items() if k not in by_content}
        return dataclasses.replace(run, run_dir=None, source=None, settings_source=None,
                                   settings=settings, config=config)

    assert [comparable(r) for r in runs_files] == [comparable(r) for r in runs_wandb]
    assert {r.settings["task.data_dir"] for r in runs_wandb} == {str(data)}
    assert len({r.settings["data.fingerprint"] for r in runs_files}) == 1
    assert [r.run_dir.parent.parent for r in runs_wandb] == [r.run_dir for r in runs_files]

    # the command line, with --source wandb on the full tree
    assert main([str(sweep), "--source", "wandb", "--reference", "none",
                 "--out", str(tmp_path / "rep")]) == 0
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert data["source"] == "wandb" and data["table_markdown"] == from_files["table_markdown"]
