"""Sweeps through Hydra's launcher plugins (joblib, submitit_local), as a user launches them:
`bertkit -m ... hydra/launcher=...` in its own process. Every job's results, one tokenisation
shared by parallel jobs, a failed job recorded while the others finish, one W&B sweep with a
group per grid point, and the report; successive halving through joblib equal to the
sequential launcher; one grid point data-parallel over the tasks of a submitit job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from bertkit.reporting.cli import main as report_main
from tests.sweeps.test_successive_halving import tiny_sweep_overrides

# The job made to fail: its run directory holds a directory where the job writes config.yaml.
# (A monkeypatch, as in test_sweep_end_to_end.py, cannot reach the launchers' worker processes.)
FAILING_JOB = "wnli/bs16-lr0.0003-ep2/seed2"
GRID_JOBS = sorted(f"wnli/bs{b}-lr{lr}-ep2/seed{s}" for b in (8, 16)
                   for lr in ("0.001", "0.0003") for s in (1, 2))


def run_bertkit(tmp_path: Path, *overrides: str, status: int = 0
                ) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path / "wandb"),
           "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "bertkit", *overrides], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == status, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def grid_overrides(data: Path, vocab: Path, sweep_dir: Path, cache: Path) -> list[str]:
    """The 2 x 2 grid x 2 seeds of test_sweep_end_to_end.py, with W&B on (offline) so that
    each job's config names its group."""
    overrides = [o for o in tiny_sweep_overrides(data, vocab, sweep_dir)
                 if not o.startswith("logger=")]
    return [*overrides, "logger=wandb", f"cache_dir={cache}"]


def tokenisations(sweep_dir: Path) -> list[str]:
    """The cache's "tokenised ..." lines over every job's log (cli.log, Hydra's job log)."""
    return [line for log in sweep_dir.rglob("cli.log") for line in log.read_text().splitlines()
            if "] - tokenised " in line]


def check_grid_sweep(sweep_dir: Path, seeds: tuple[int, ...] = (1, 2)) -> None:
    """The grid's jobs of those seeds ran (the failing job's seed among them)."""
    jobs = [job for job in GRID_JOBS if int(job.rpartition("/seed")[2]) in seeds]
    finished = sorted(p.parent.relative_to(sweep_dir).as_posix()
                      for p in sweep_dir.rglob("metrics.json"))
    assert finished == [job for job in jobs if job != FAILING_JOB]
    failure = json.loads((sweep_dir / FAILING_JOB / "failed.json").read_text())
    assert "IsADirectoryError" in failure["error"] and "seed=2" in failure["overrides"]

    # Tokenised once for the whole sweep (train, dev and test of one task), although jobs
    # started side by side; every job read the same entry.
    lines = tokenisations(sweep_dir)
    assert sorted(line.split(" - tokenised ")[1].split()[0] for line in lines) == [
        "test", "train", "validation"], lines
    assert len({line.split(" into ")[1] for line in lines}) == 1

    # One W&B sweep for the launch (the multirun directory's name), in every job; one group per
    # grid point, its seeds together.
    loggers = {job: OmegaConf.load(sweep_dir / job / "config.yaml").logger for job in finished}
    assert {logger.sweep_id for logger in loggers.values()} == {f"paper_grid-{sweep_dir.name}"}
    groups = {}
    for job, logger in loggers.items():
        groups.setdefault(logger.group, set()).add(job.rsplit("/", 1)[0])
    assert sorted(groups) == sorted(
        f"paper_grid-{sweep_dir.name} per_device_train_batch_size:{batch} learning_rate:{rate}"
        for batch in (8, 16) for rate in ("0.001", "0.0003")
        if any(job.startswith(f"wnli/bs{batch}-lr{rate}-") for job in finished))
    assert all(len(points) == 1 for points in groups.values())

    assert report_main([str(sweep_dir)]) == 0
    report = (sweep_dir / "report" / "report.md").read_text()
    assert f"{len(finished)} finished run(s) and 1 failed job(s)" in report
    summary = json.loads((sweep_dir / "report" / "report.json").read_text())
    assert summary["systems"][0]["tasks"]["wnli"]["runs_tried"] == len(finished)


def block_failing_job(sweep_dir: Path) -> None:
    (sweep_dir / FAILING_JOB / "config.yaml").mkdir(parents=True)


# joblib runs the whole grid (seeds grouped per grid point); submitit_local, a process per
# job, the failing job's seed alone: every grid point, a failed job among finished ones.
@pytest.mark.slow
@pytest.mark.parametrize(("launcher", "seeds"), [
    (["hydra/launcher=local_parallel", "hydra.launcher.n_jobs=2"], (1, 2)),
    (["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10"], (2,)),
], ids=["joblib", "submitit_local"])
def test_paper_grid_through_a_launcher(launcher, seeds, glue_dir, vocab_dir, tmp_path):
    data = glue_dir("wnli", n_train=64)
    sweep_dir = tmp_path / "multirun" / "2026-01-01_00-00-00"
    block_failing_job(sweep_dir)
    overrides = [f"seed={','.join(map(str, seeds))}" if o.startswith("seed=") else o
                 for o in grid_overrides(data, vocab_dir, sweep_dir, tmp_path / "cache")]
    result = run_bertkit(tmp_path, "-m", "sweep=paper_grid", *launcher, *overrides,
                         status=1)  # the failed job, after every job ran
    assert f"\n  {FAILING_JOB} [" in result.stderr, result.stderr[-3000:]
    check_grid_sweep(sweep_dir, seeds)
    if launcher[0].endswith("submitit_local"):  # submitit's own records, one per job
        assert len(list((sweep_dir / ".submitit").glob("*/*_result.pkl"))) == 4 * len(seeds)


@pytest.mark.slow
def test_successive_halving_through_joblib_matches_the_sequential_launcher(halving_sweep,
                                                                           tmp_path):
    """The sequential sweep is the shared one (tests.runs.halving_sweep); joblib's, on its data,
    is run here."""
    data, vocab = halving_sweep / "glue" / "wnli", halving_sweep / "vocab"
    run_bertkit(tmp_path, "-m", "sweep=paper_grid_halving", "hydra/launcher=local_parallel",
                "hydra.launcher.n_jobs=2",
                *grid_overrides(data, vocab, tmp_path / "joblib", tmp_path / "cache"))
    results = {}
    for name, sweep_dir in [("sequential", halving_sweep / "sequential"),
                            ("joblib", tmp_path / "joblib")]:
        ledger = json.loads((sweep_dir / "halving.json").read_text())
        rungs = [sorted(Path(job["run_dir"]).relative_to(sweep_dir).as_posix()
                        for job in rung["jobs_detail"] if job["continues"])
                 for rung in ledger["rungs"]]
        records = {p.parent.relative_to(sweep_dir).as_posix(): json.loads(p.read_text())
                   for p in sweep_dir.rglob("metrics.json")}
        scores = {job: (record["main_value"], record["train"]["steps"])
                  for job, record in records.items()}
        results[name] = rungs, scores, ledger["compute"]
    (seq_rungs, seq_scores, seq_compute), (par_rungs, par_scores, par_compute) = (
        results["sequential"], results["joblib"])
    assert [len(r) for r in seq_rungs] == [4, 2, 2]  # 4 -> 2 -> 1 configurations x 2 seeds
    assert par_rungs == seq_rungs
    assert par_scores.keys() == seq_scores.keys() and len(seq_scores) == 8
    for job, (value, steps) in seq_scores.items():
        assert par_scores[job][1] == steps
        assert par_scores[job][0] == pytest.approx(value, abs=1e-6), job
    # The same training examples (the seconds are each launch's own).
    assert ({k: v for k, v in par_compute.items() if "seconds" not in k}
            == {k: v for k, v in seq_compute.items() if "seconds" not in k})


@pytest.mark.slow
@pytest.mark.distributed
def test_one_grid_point_data_parallel_over_the_tasks_of_a_submitit_job(
        glue_dir, vocab_dir, tmp_path):
    """hydra/launcher=slurm_multi_gpu's mechanism on this machine: 2 tasks of one submitit job
    become ranks 0 and 1 of one run (gloo on CPU), as under torchrun."""
    data = glue_dir("wnli", n_train=40)
    sweep_dir = tmp_path / "sweep"
    run_bertkit(tmp_path, "-m", "recipe=glue", "task=wnli", f"task.data_dir={data}",
                "model=scratch_tiny", f"model.tokenizer={vocab_dir}",
                "model.config.hidden_size=32", "model.config.intermediate_size=64",
                "logger=none", "trainer.max_steps=3", "trainer.per_device_train_batch_size=4",
                "trainer.disable_tqdm=true", "seed=1,2", f"hydra.sweep.dir={sweep_dir}",
                "hydra.sweep.subdir=seed${seed}", f"cache_dir={tmp_path / 'cache'}",
                "hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=2",
                "hydra.launcher.timeout_min=10")
    for seed in (1, 2):
        metrics = json.loads((sweep_dir / f"seed{seed}" / "metrics.json").read_text())
        assert metrics["train"]["steps"] == 3
        assert metrics["hyperparameters"]["train_batch_size"] == 8  # 4 per process x 2
    # Each job ran as two tasks (submitit writes one log per task).
    logs = sorted((sweep_dir / ".submitit").glob("*/*_log.out"))
    assert sorted(log.name.split("_")[1] for log in logs) == ["0", "0", "1", "1"]
