"""A multirun in which a job failed exits 1 once every job ran, with one line per failed job
(its directory, the overrides it ran with beyond the command line's, its error), whichever
launcher or sweeper ran the jobs; only this launch's failed.json files count."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from bertkit.cli import FailedJobsCheck
from bertkit.data.atomic_files import write_json_atomic

COMMAND_LINE = ["recipe=glue", "task=rte", "seed=1,2"]


def launch_config(sweep_dir: Path):
    """What Hydra hands a callback: the launch's sweep directory and command line."""
    return OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep_dir)},
                                       "overrides": {"task": COMMAND_LINE}}})


def failed_record(seed: int, error: str) -> dict:
    return {"error": error, "job": seed - 1, "overrides": ["recipe=glue", "task=rte",
                                                           f"seed={seed}"]}


def test_only_the_failed_jobs_of_this_launch_fail_it(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    # An earlier launch into the same directory left two failed jobs.
    write_json_atomic(sweep / "rte" / "0" / "failed.json", failed_record(1, "old error"))
    write_json_atomic(sweep / "rte" / "1" / "failed.json", failed_record(2, "old error"))
    config = launch_config(sweep)

    check = FailedJobsCheck()
    check.on_multirun_start(config)
    check.on_multirun_end(config)  # nothing failed in this launch: no exit, nothing printed
    assert capsys.readouterr().err == ""

    check.on_multirun_start(config)
    # This launch: job 1 fails again (the same file written anew, same size), job 2 fails
    # with a message of several lines, job 3's record is cut short (a full disk).
    write_json_atomic(sweep / "rte" / "1" / "failed.json", failed_record(2, "old error"))
    write_json_atomic(sweep / "rte" / "2" / "failed.json",
                      failed_record(3, "ValueError: data error:\n  row 3\nmore"))
    (sweep / "rte" / "3").mkdir()
    (sweep / "rte" / "3" / "failed.json").write_text('{"error": "cut')
    with pytest.raises(SystemExit) as stopped:
        check.on_multirun_end(config)
    assert stopped.value.code == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == (f"bertkit: 3 job(s) of this sweep failed (each one's failed.json says "
                        f"more); what finished is kept in {sweep} (bertkit-report {sweep}):")
    assert lines[1:3] == ["  rte/1 [seed=2]: old error",
                          "  rte/2 [seed=3]: ValueError: data error: ..."]
    assert lines[3].startswith(f"  rte/3: {sweep / 'rte' / '3' / 'failed.json'} is unreadable")
    assert len(lines) == 4  # rte/0, an earlier launch's failure, is not named


def test_a_sweep_that_never_started_is_not_checked(tmp_path):
    FailedJobsCheck().on_multirun_end(launch_config(tmp_path))  # no exit


# Refused by bertkit's range check as each job starts, before any data or model is read: the
# cheapest failure that reaches every launcher's job processes.
FAILING = ["recipe=demo", "logger=none", "trainer.weight_decay=-1"]
LAUNCHES = {
    "basic": ["seed=1,2"],
    "joblib": ["seed=1,2", "hydra/launcher=local_parallel", "hydra.launcher.n_jobs=2"],
    "gpu_pack": ["seed=1,2", "hydra/launcher=gpu_pack", "hydra.launcher.jobs_per_gpu=2"],
    "halving": ["sweep=paper_grid_halving", "trainer.learning_rate=5e-5",
                "trainer.per_device_train_batch_size=32", "trainer.num_train_epochs=3",
                "seed=1,2"],
    # Every trial fails: Optuna's sweeper then raises ("No trials are completed yet"), after
    # the jobs' summary.
    "optuna": ["sweep=optuna", "hydra.sweeper.n_trials=2"],
}


@pytest.mark.slow
@pytest.mark.parametrize("launch", sorted(LAUNCHES))
def test_a_sweep_with_failed_jobs_exits_1_naming_them_through_every_launcher(launch,
                                                                              tmp_path):
    sweep = tmp_path / "sweep"
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    result = subprocess.run(
        [sys.executable, "-m", "bertkit", "-m", *FAILING, *LAUNCHES[launch],
         f"cache_dir={tmp_path / 'cache'}", f"hydra.sweep.dir={sweep}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    output = result.stdout[-3000:] + result.stderr[-3000:]
    assert result.returncode == 1, output
    assert "Traceback" not in result.stderr, output
    failed = sorted(path.parent.relative_to(sweep).as_posix()
                    for path in sweep.rglob("failed.json"))
    assert len(failed) == 2, failed
    summary = result.stderr[result.stderr.index("bertkit: 2 job(s) of this sweep failed"):]
    named = summary.splitlines()[1:3]
    assert [line.split()[0] for line in named] == failed, summary
    assert all(line.endswith(": trainer.weight_decay=-1.0: expected a number >= 0")
               for line in named), summary
    if launch == "optuna":
        assert summary.splitlines()[3] == (
            "then the sweeper stopped: ValueError: No trials are completed yet.")
