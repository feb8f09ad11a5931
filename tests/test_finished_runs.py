"""A finished run is never overwritten: a job started in a directory that holds one (the
result file bertkit.jobs.JOBS names for each job) stops before it writes anything, in one line
naming the run and the ways on (another directory, resume=true, overwrite=true); a sweep job
so refused fails like any failed job, and the sweep's other jobs run. Cases come from the
registry: every job against a finished run of every job, and a real tiny run of each family,
of pretraining and of two-stage finetuning."""

from __future__ import annotations

import copy
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from bertkit.errors import BertkitError
from bertkit.jobs import (
    FINISHED,
    JOBS,
    RUN_CONFIG_FILE,
    SCHEDULE_KEYS,
    SET_ASIDE,
    check_finished_run,
    finished_message,
    prepare_job,
    run_job,
)
from bertkit.sweeps.halving import read_outcome
from bertkit.tasks import FAMILIES
from bertkit.training.stop_and_resume import remove_set_aside, scan_checkpoints
from tests.conftest import compose_config, tiny_run_overrides
from tests.finetuning.test_every_family import family_run  # noqa: F401
from tests.pretraining.test_pretrain_recipe import tiny_pretraining_overrides
from tests.tasks.ner.test_ner_recipe import conll_files  # noqa: F401
from tests.tasks.squad.test_squad_recipe import squad_files  # noqa: F401
from tests.tasks.swag.test_swag_recipe import swag_files  # noqa: F401

# What else a finished run leaves beside its result file: none of it may change.
RUN_FILES = {"config.yaml": "seed: 1\n", ".hydra/config.yaml": "seed: 1\n", "cli.log": "done\n",
             "model/model.safetensors": "weights", "checkpoints/checkpoint-2/trainer_state.json":
             "{}"}


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes()
            for path in sorted(root.rglob("*")) if path.is_file()}


def write_files(run_dir: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / name).write_text(text)
    return run_dir


@functools.cache
def demo_config(*overrides: str) -> DictConfig:
    return compose_config(["recipe=demo", *overrides])


def job_config(job: str, *overrides: str) -> DictConfig:
    """The composed demo config, its recipe.job set to `job` (all the check reads)."""
    cfg = copy.deepcopy(demo_config(*overrides))
    OmegaConf.update(cfg, "recipe.job", job)
    return cfg


@pytest.mark.parametrize("job", JOBS)
def test_every_job_refuses_a_finished_run_of_every_job(job, tmp_path):
    for earlier, finished in JOBS.items():
        run_dir = write_files(tmp_path / earlier, {**RUN_FILES, finished.result_file: "{}"})
        reused = JOBS[job].reuses_its_runs and finished.result_file == JOBS[job].result_file
        ways_on = {"": reused, "overwrite=true": True, "resume=true": JOBS[job].resumes or reused}
        for way_on, goes_on in ways_on.items():
            cfg = job_config(job, *([way_on] if way_on else []))
            if goes_on:
                check_finished_run(cfg, run_dir)
                continue
            with pytest.raises(BertkitError) as refused:
                check_finished_run(cfg, run_dir)
            message = str(refused.value)
            assert "\n" not in message
            assert message.startswith(f"{run_dir} holds a finished run "
                                      f"({finished.result_file}): give hydra.run.dir=")
            assert "overwrite=true" in message
            assert ("resume=true" in message) == JOBS[job].resumes


def test_a_run_that_did_not_finish_is_not_refused(tmp_path):
    """Preempted (a checkpoint), failed (failed.json), a rung set aside by successive halving,
    a two-stage run whose first stage alone ended, a parity benchmark's seeds alone."""
    run_dir = write_files(tmp_path / "run", {
        **RUN_FILES, "failed.json": "{}", "metrics_rung0.json": "{}",
        "intermediate/metrics.json": "{}", "bertkit/seed_1/parity_run.json": "{}"})
    for job in JOBS:
        check_finished_run(job_config(job), run_dir)


def set_aside_folders(run_dir: Path) -> list[Path]:
    return sorted(run_dir.parent.glob(f".{run_dir.name}.overwritten-*"))


@pytest.mark.parametrize("job", JOBS)
def test_overwrite_sets_aside_whatever_an_earlier_run_left_for_every_job(job, tmp_path):
    """A finished run of every job, and runs that did not finish (preempted: checkpoints;
    failed): overwrite=true moves all of it aside, and it is gone once the new run started."""
    earlier = {**{f"finished_{name}": {finished.result_file: "{}"}
                  for name, finished in JOBS.items()},
               "preempted": {}, "failed": {"failed.json": "{}"}}
    for name, extra in earlier.items():
        run_dir = write_files(tmp_path / name / "run", {**RUN_FILES, **extra})
        before = snapshot(run_dir)
        assert prepare_job(job_config(job, "overwrite=true"), run_dir) is None
        assert list(run_dir.iterdir()) == []
        [folder] = set_aside_folders(run_dir)
        assert snapshot(folder) == before
        remove_set_aside()  # what the new run does once its training begins
        assert set_aside_folders(run_dir) == []


def test_overwrite_leaves_a_directory_that_holds_no_run_as_it_is(tmp_path):
    run_dir = write_files(tmp_path / "run", {"notes.txt": "mine"})
    assert check_finished_run(job_config("finetune", "overwrite=true"), run_dir) is None


@pytest.mark.parametrize("job", [name for name, job in JOBS.items() if job.resumes])
def test_resume_on_a_finished_run_leaves_it_as_it_is_and_returns_its_result(job, tmp_path):
    """resume=true|auto on a finished run: its record, every file unchanged; on an unfinished
    one with overwrite=true too, the run is continued (successive halving's later rungs)."""
    result = {"main_value": 0.5, "train": {"loss": 0.712}}
    run_dir = write_files(tmp_path / "run", {**RUN_FILES, "metrics.json": json.dumps(result)})
    before = snapshot(run_dir)
    for resume in ("true", "auto"):
        assert check_finished_run(job_config(job, f"resume={resume}"), run_dir) == FINISHED
        assert prepare_job(job_config(job, f"resume={resume}"), run_dir) == result
        assert snapshot(run_dir) == before
    assert check_finished_run(job_config(job, "resume=auto", "overwrite=true"),
                              run_dir) == SET_ASIDE
    with pytest.raises(BertkitError, match=r"resume=true leaves it as it is and overwrite=true "
                                           r"writes over it: give one of them$"):
        check_finished_run(job_config(job, "resume=true", "overwrite=true"), run_dir)
    unfinished = write_files(tmp_path / "unfinished", RUN_FILES)
    for resume in ("true", "auto"):
        cfg = job_config(job, f"resume={resume}", "overwrite=true")
        assert check_finished_run(cfg, unfinished) is None


@pytest.mark.slow  # two runs per job
@pytest.mark.parametrize("job", [name for name, job in JOBS.items() if job.resumes])
def test_resume_with_a_longer_schedule_continues_a_finished_run(job, tmp_path):
    """A finished run's config.yaml holds its schedule (SCHEDULE_KEYS): resumed with the same
    or a shorter one, nothing is left to do; with a longer one, it is continued to the new
    end (training a finished run on, as the time-budget tests do)."""
    finished = job_config(job)
    run_dir = write_files(tmp_path / "run", {
        **RUN_FILES, "metrics.json": "{}", RUN_CONFIG_FILE: OmegaConf.to_yaml(finished)})
    steps = max(int(finished.trainer.max_steps), 4)
    OmegaConf.update(finished, "trainer.max_steps", steps)
    (run_dir / RUN_CONFIG_FILE).write_text(OmegaConf.to_yaml(finished))
    for key in SCHEDULE_KEYS:  # the schedule is read from the run's config, every key
        assert OmegaConf.select(finished, key, default="absent") != "absent", key
    def check(resume: str, steps: int):
        return check_finished_run(job_config(job, f"resume={resume}",
                                             f"trainer.max_steps={steps}"), run_dir)

    for resume in ("true", "auto"):
        assert check(resume, steps) == FINISHED
        assert check(resume, steps - 1) == FINISHED  # shorter: nothing to do
        assert check(resume, steps + 2) is None  # longer: continued
    (run_dir / RUN_CONFIG_FILE).unlink()  # no record of its schedule: finished for any
    assert check_finished_run(job_config(job, "resume=true", f"trainer.max_steps={steps + 2}"),
                              run_dir) == FINISHED


def test_run_job_refuses_before_it_reads_or_writes_anything(glue_dir, vocab_dir, tmp_path):
    run_dir = write_files(tmp_path / "run", {**RUN_FILES, "metrics.json": "{}"})
    before = snapshot(run_dir)
    cfg = compose_config(tiny_run_overrides("rte", tmp_path / "no_data", vocab_dir))
    with pytest.raises(BertkitError, match=rf"^{run_dir} holds a finished run \(metrics.json\)"):
        run_job(cfg, run_dir)
    assert snapshot(run_dir) == before


def test_successive_halving_reads_a_refused_job_as_failed(tmp_path):
    run_dir = write_files(tmp_path / "run", {
        "metrics.json": json.dumps({"train": {"steps": 4, "planned_steps": 4}}),
        "failed.json": json.dumps({"error": f"{tmp_path} holds a finished run"})})
    outcome = read_outcome(run_dir, None)
    assert outcome.score is None and "holds a finished run" in outcome.error


def training_kinds() -> list[str]:
    return [*FAMILIES, "pretrain", "two_stage"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", training_kinds())
def test_a_finished_run_of_each_training_job_is_left_as_it_was(kind, family_run,  # noqa: F811
                                                                glue_dir, vocab_dir, tmp_path):
    if kind == "pretrain":
        cfg = compose_config(tiny_pretraining_overrides(**{
            "trainer.max_steps": 2, "model.config.hidden_size": 32,
            "model.config.intermediate_size": 64, "trainer.per_device_train_batch_size": 8}))
    elif kind == "two_stage":
        cfg = compose_config(tiny_run_overrides("mrpc", glue_dir("mrpc"), vocab_dir, **{
            "finetuning": "stilts", "finetuning.intermediate.task": "rte",
            "finetuning.intermediate.data_dir": str(glue_dir("rte")),
            "trainer.max_steps": 2}))
    else:
        cfg = family_run(kind, {"trainer.max_steps": 2})
    run_dir = tmp_path / "run"
    run_job(cfg, run_dir)
    assert (run_dir / JOBS[cfg.recipe.job].result_file).is_file()  # what the registry names
    before = snapshot(run_dir)
    with pytest.raises(BertkitError, match="holds a finished run"):
        run_job(cfg, run_dir)
    assert snapshot(run_dir) == before


def listing(root: Path) -> set[str]:
    return {str(path.relative_to(root)) for path in root.rglob("*")}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["finetune", "pretrain"])
def test_overwrite_leaves_nothing_of_the_earlier_run(kind, glue_dir, vocab_dir, tmp_path):
    """A 2-step run with overwrite=true over a finished 4-step run (checkpoints 2 and 4)
    leaves the directory a fresh 2-step run leaves, and resume=auto after it finds
    checkpoint-2, not the old run's checkpoint-4."""
    def overrides(steps: int, *extra: str) -> list[str]:
        saving = {"trainer.max_steps": steps, "trainer.save_strategy": "steps",
                  "trainer.save_steps": 2, "trainer.save_total_limit": 3,
                  "keep_checkpoints": True, "cache_dir": tmp_path / "cache"}
        if kind == "pretrain":
            return [*tiny_pretraining_overrides(**{
                **saving, "model.config.hidden_size": 32, "model.config.intermediate_size": 64,
                "trainer.per_device_train_batch_size": 8}), *extra]
        return [*tiny_run_overrides("rte", glue_dir("rte"), vocab_dir, **saving), *extra]

    run_dir, fresh_dir = tmp_path / "run", tmp_path / "fresh"
    run_job(compose_config(overrides(4)), run_dir)
    earlier = listing(run_dir)  # what the earlier run left
    assert {"checkpoints/checkpoint-4", "metrics.json", "model"} <= earlier
    run_job(compose_config(overrides(2, "overwrite=true")), run_dir)
    run_job(compose_config(overrides(2)), fresh_dir)
    assert earlier - listing(fresh_dir)  # the old run left what a 2-step run does not write
    assert listing(run_dir) == listing(fresh_dir)
    assert set_aside_folders(run_dir) == []
    assert scan_checkpoints(run_dir / "checkpoints").complete.name == "checkpoint-2"


def bertkit(*overrides, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled"}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", "bertkit", *overrides], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def assert_refused(result: subprocess.CompletedProcess, run_dir: Path,
                   kept_checkpoints: bool) -> None:
    """Refused in one line; a longer schedule is offered only to a run that kept its
    checkpoints (keep_checkpoints=true): nothing else can train it on."""
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stdout + result.stderr
    longer = ("resume=true with a longer schedule (trainer.max_steps, "
              "trainer.num_train_epochs or budget.minutes) to train it on, "
              if kept_checkpoints else "")
    assert result.stderr.strip().splitlines()[-1] == (
        f"bertkit: error: {run_dir} holds a finished run (metrics.json): give "
        f"hydra.run.dir=<another directory>, {longer}or overwrite=true to write over it")


@pytest.mark.slow
def test_a_second_command_leaves_the_finished_run_whole_even_hydras_files(glue_dir, vocab_dir,
                                                                          tmp_path):
    run_dir = tmp_path / "run"
    command = [*tiny_run_overrides("rte", glue_dir("rte"), vocab_dir, **{
        "trainer.max_steps": 2, "trainer.save_strategy": "steps", "trainer.save_steps": 2,
        "keep_checkpoints": True}), f"hydra.run.dir={run_dir}"]
    assert bertkit(*command, cwd=tmp_path).returncode == 0
    before = snapshot(run_dir)
    assert {".hydra/config.yaml", "cli.log", "metrics.json", "model/model.safetensors",
            "checkpoints/checkpoint-2/model.safetensors"} <= before.keys()
    assert_refused(bertkit(*command, cwd=tmp_path), run_dir, kept_checkpoints=True)
    assert snapshot(run_dir) == before
    for resume in ("true", "auto"):  # nothing left to do: said in one line, nothing touched
        result = bertkit(*command, f"resume={resume}", cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stderr.strip().splitlines() == [
            f"bertkit: {finished_message(run_dir, 'metrics.json', resume)}"]
        assert snapshot(run_dir) == before
    result = bertkit(*command, "overwrite=true", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    [folder] = [line.split(" is set aside in ")[1].split(",")[0]
                for line in result.stderr.splitlines() if " is set aside in " in line]
    assert not Path(folder).exists() and set_aside_folders(run_dir) == []
    after = snapshot(run_dir)
    assert b"overwrite=true" in after[".hydra/overrides.yaml"]
    assert not after["cli.log"].startswith(before["cli.log"])  # the earlier run's log is gone


@pytest.mark.slow
def test_a_sweep_job_in_a_finished_run_fails_and_the_others_run(glue_dir, vocab_dir, tmp_path):
    sweep = tmp_path / "sweep"
    command = ["-m", *tiny_run_overrides("rte", glue_dir("rte"), vocab_dir,
                                         **{"trainer.max_steps": 2}),
               f"hydra.sweep.dir={sweep}", "hydra.sweep.subdir=${hydra.job.num}"]
    assert bertkit(*command, "seed=1", cwd=tmp_path).returncode == 0
    # Hydra rewrites a sweep job's .hydra/ and appends to its log before any bertkit code runs.
    kept = {name: data for name, data in snapshot(sweep / "0").items()
            if not name.startswith(".hydra/") and name != "cli.log"}
    result = bertkit(*command, "seed=1,2", cwd=tmp_path)
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"job 0 failed: {sweep / '0'} holds a finished run (metrics.json): give " \
           f"hydra.sweep.dir=" in result.stdout + result.stderr
    failed = json.loads((sweep / "0" / "failed.json").read_text())["error"]
    assert failed.startswith(f"{sweep / '0'} holds a finished run")
    assert {name: data for name, data in snapshot(sweep / "0").items() if name in kept} == kept
    assert (sweep / "1" / "metrics.json").is_file()
    # A single run reusing a sweep job's directory: refused before Hydra writes there.
    before = snapshot(sweep / "1")
    single = [arg for arg in command[1:] if not arg.startswith("hydra.sweep")]
    assert_refused(bertkit(*single, f"hydra.run.dir={sweep / '1'}", cwd=tmp_path), sweep / "1",
                   kept_checkpoints=False)
    assert snapshot(sweep / "1") == before
    # resume=true on the finished jobs: each returns its result, every file of the run kept.
    runs = {job: {name: data for name, data in snapshot(sweep / job).items()
                  if not name.startswith(".hydra/") and name != "cli.log"} for job in "01"}
    result = bertkit(*command, "seed=1,2", "resume=true", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    for job in "01":
        assert {name: data for name, data in snapshot(sweep / job).items()
                if name in runs[job]} == runs[job]
        assert finished_message(sweep / job, "metrics.json", True) in \
            (sweep / job / "cli.log").read_text()
    # overwrite=true: what the earlier job left is gone; this launch's .hydra/ and log stay.
    (sweep / "0" / "left_by_the_earlier_run.tsv").write_text("stale")
    result = bertkit(*command, "seed=1", "overwrite=true", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert not (sweep / "0" / "left_by_the_earlier_run.tsv").exists()
    assert "overwrite=true" in (sweep / "0" / ".hydra" / "overrides.yaml").read_text().lower()
    assert "is set aside in" in (sweep / "0" / "cli.log").read_text()
    assert (sweep / "0" / "metrics.json").is_file() and set_aside_folders(sweep / "0") == []
