"""The `bertkit` command as users meet it: one clear line for bad input, no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.glue_fixtures import write_tsv


def run_cli(*overrides, cwd, env_extra=None):
    env = {**os.environ, "WANDB_MODE": "disabled", **(env_extra or {})}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", "bertkit", *overrides], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def assert_clean_failure(result, *fragments):
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "Traceback" not in output, output
    for fragment in fragments:
        assert fragment in output, output


@pytest.mark.slow
def test_typo_in_override(tmp_path):
    result = run_cli("recipe=glue", "task=rte", "trainer.learnin_rate=1", cwd=tmp_path)
    assert_clean_failure(result, "trainer.learnin_rate")


@pytest.mark.slow
def test_unknown_task(tmp_path):
    result = run_cli("recipe=glue", "task=rtee", cwd=tmp_path)
    assert_clean_failure(result, "task/rtee", "rte")


@pytest.mark.slow
def test_missing_data_dir(tmp_path):
    result = run_cli("recipe=glue", "task=rte", f"task.data_dir={tmp_path}/nowhere",
                     "logger=none", cwd=tmp_path)
    assert_clean_failure(result, f"task.data_dir={tmp_path}/nowhere", "no such directory")
    assert result.returncode == 2


@pytest.mark.slow
@pytest.mark.parametrize("problem", ["label", "column", "unknown_trainer_option"])
def test_bad_input_is_one_message(problem, glue_dir, vocab_dir, tmp_path):
    data = glue_dir("rte")
    extra = []
    if problem == "label":
        rows = (data / "train.tsv").read_text().splitlines()
        rows[3] = rows[3].rsplit("\t", 1)[0] + "\tmaybe"
        (data / "train.tsv").write_text("\n".join(rows) + "\n")
        expected = [f"{data / 'train.tsv'}, line 4", "'maybe'", "task.labels"]
    elif problem == "column":
        header, *rows = (data / "dev.tsv").read_text().splitlines()
        write_tsv(data / "dev.tsv", header.replace("sentence2", "hypothesis").split("\t"),
                  [r.split("\t") for r in rows])
        expected = [f"{data / 'dev.tsv'}, line 1", "'sentence2'", "task.columns.text_b"]
    else:
        extra = ["+trainer.not_an_option=1"]
        expected = ["trainer:", "not_an_option"]
    result = run_cli("recipe=glue", "task=rte", f"task.data_dir={data}", "model=scratch_tiny",
                     f"model.tokenizer={vocab_dir}", "logger=none", "trainer.max_steps=1",
                     *extra, cwd=tmp_path)
    assert_clean_failure(result, *expected)
    assert not list(tmp_path.rglob("metrics.json"))


@pytest.mark.slow
def test_failed_sweep_job_does_not_stop_the_others_and_the_sweep_fails(glue_dir, vocab_dir,
                                                                       tmp_path):
    """The failed job is recorded, the other one runs to the end, then the sweep exits 1 with
    one line per failed job: its directory, its own overrides, its error."""
    good = glue_dir("wnli")
    result = run_cli("-m", "recipe=glue", "task=wnli", f"task.data_dir={tmp_path}/missing,{good}",
                     "model=scratch_tiny", f"model.tokenizer={vocab_dir}", "logger=none",
                     "model.config.hidden_size=32", "model.config.intermediate_size=64",
                     "trainer.max_steps=2", "trainer.save_strategy=no",
                     f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.sweep.subdir=${hydra.job.num}",
                     cwd=tmp_path)
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    failed = (tmp_path / "sweep" / "0" / "failed.json").read_text()
    assert "no such directory" in failed
    assert not (tmp_path / "sweep" / "0" / "metrics.json").exists()
    assert (tmp_path / "sweep" / "1" / "metrics.json").is_file()
    assert "Traceback" not in result.stderr
    summary = result.stderr[result.stderr.index("bertkit: 1 job(s) of this sweep failed"):]
    assert summary.splitlines()[1:] == [
        f"  0 [task.data_dir={tmp_path}/missing]: task.data_dir={tmp_path}/missing: "
        f"no such directory"], summary


@pytest.mark.slow
def test_paper_grid_sweep_names_each_job_by_its_grid_point(glue_dir, vocab_dir, tmp_path):
    """sweep=paper_grid supplies the grid; a grid key given on the command line narrows it."""
    data = glue_dir("wnli")
    result = run_cli("-m", "recipe=glue", "task=wnli", f"task.data_dir={data}", "sweep=paper_grid",
                     "trainer.learning_rate=5e-5", "trainer.num_train_epochs=2", "seed=1,2",
                     "model=scratch_tiny", f"model.tokenizer={vocab_dir}", "logger=none",
                     "model.config.hidden_size=32", "model.config.intermediate_size=64",
                     "trainer.max_steps=1", "trainer.save_strategy=no",
                     "trainer.eval_strategy=no", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    found = sorted(str(path.parent.relative_to(tmp_path / "sweep"))
                   for path in (tmp_path / "sweep").rglob("metrics.json"))
    assert found == [f"wnli/bs{batch}-lr5e-05-ep2/seed{seed}"
                     for batch in (16, 32) for seed in (1, 2)]
    metrics = json.loads((tmp_path / "sweep" / "wnli" / "bs32-lr5e-05-ep2" / "seed2"
                          / "metrics.json").read_text())
    assert metrics["hyperparameters"]["per_device_train_batch_size"] == 32
    assert metrics["seed"] == 2


def test_the_value_returned_to_hydra_is_the_main_dev_metric():
    from bertkit.cli import sweeper_value

    assert sweeper_value({"main_metric": "f1", "main_value": 0.81}) == 0.81
    # A pretraining job: its first downstream finetune's, or nothing to rank by.
    assert sweeper_value({"downstream": {"rte": {"main_value": 0.55}, "mrpc": {"main_value": 0.7}}
                       }) == 0.55
    assert sweeper_value({"last_log": {"mlm_loss": 3.2}}) is None
    assert sweeper_value(None) is None
