"""The bench_sweep job: the wall time of one small grid launched sequentially (Hydra's basic
launcher) and in parallel (hydra/launcher=local_parallel), both as the `bertkit -m` command a
user types, after a warm-up job fills the tokenisation cache. docs/speed.md ("How
bench-sweep compares") says what the ratio means on a CPU. Writes sweep_bench.json and prints
a table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from benchmarks.command import main
from benchmarks.measure import ratio, timed
from benchmarks.report import markdown_head, publish
from benchmarks.settings import check_settings
from bertkit.data.atomic_files import read_json
from bertkit.data.metrics_file import METRICS_FILE
from bertkit.errors import BertkitError
from bertkit.jobs import Job

RESULT_FILE = "sweep_bench.json"  # written last (JOB names it)

WAYS = ("sequential", "parallel")


def _job_overrides(bench_sweep: DictConfig, cache_dir: str) -> list[str]:
    """This job's command line as a finetune's: recipe=glue, its task and model, and the
    user's other overrides (data directory, ...) without the benchmark's own keys."""
    choices = HydraConfig.get().runtime.choices
    own = ("recipe=", "bench_sweep.", "hydra.", "task=", "model=", "overwrite=")
    passed = [o for o in HydraConfig.get().overrides.task if not o.lstrip("+~").startswith(own)]
    # overwrite=true: the finetunes' directories are this benchmark's own, which a relaunch
    # of an unfinished benchmark measures again.
    return ["recipe=glue", f"task={choices['task']}", f"model={choices['model']}",
            *passed, *bench_sweep.job, f"cache_dir={cache_dir}", "overwrite=true"]


def launch(overrides: list[str], log: Path, job: str = "bench_sweep") -> float:
    """The wall seconds of `bertkit <overrides>` as a user's command (its own process: Python's
    start, imports and Hydra included), its output in log; a failure names the log."""
    with open(log, "w") as handle:
        done, seconds = timed(subprocess.run, [sys.executable, "-m", "bertkit", *overrides],
                              stdout=handle, stderr=subprocess.STDOUT, sync=False)
    if done.returncode != 0:
        raise BertkitError(f"{job}: `bertkit {' '.join(overrides)}` failed "
                           f"(exit {done.returncode}); its output is in {log}")
    return seconds


def _scores(sweep_dir: Path) -> dict[str, float]:
    return {p.parent.relative_to(sweep_dir).as_posix(): read_json(p)["main_value"]
            for p in sorted(sweep_dir.rglob(METRICS_FILE))}


def benchmark_sweep_launchers(cfg: DictConfig, run_dir: Path | None = None) -> dict:
    check_settings(cfg)
    run_dir = Path(run_dir or HydraConfig.get().runtime.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    job = _job_overrides(cfg.bench_sweep, cfg.cache_dir)
    seeds = ",".join(str(seed) for seed in cfg.bench_sweep.seeds)
    launch([*job, "trainer.max_steps=1", f"hydra.run.dir={run_dir / 'warmup'}"],
            run_dir / "warmup.log")
    launchers = {"sequential": [],
                 "parallel": ["hydra/launcher=local_parallel",
                              f"hydra.launcher.n_jobs={cfg.bench_sweep.n_jobs}"]}
    ways = {}
    for way in WAYS:
        sweep_dir = run_dir / way
        seconds = launch(["-m", *job, *cfg.bench_sweep.grid, f"seed={seeds}",
                           f"hydra.sweep.dir={sweep_dir}", *launchers[way]],
                          run_dir / f"{way}.log")
        ways[way] = {"wall_seconds": round(seconds, 2), "scores": _scores(sweep_dir),
                     "launcher": launchers[way] or ["hydra/launcher=basic"]}
    jobs = len(ways["sequential"]["scores"])
    if jobs == 0 or ways["parallel"]["scores"].keys() != ways["sequential"]["scores"].keys():
        raise BertkitError(f"bench_sweep: the two ways finished different jobs; see "
                           f"{run_dir}/sequential.log and parallel.log")
    difference = max(abs(ways["parallel"]["scores"][j] - ways["sequential"]["scores"][j])
                     for j in ways["sequential"]["scores"])
    result = {"task": cfg.task.name, "jobs": jobs, "n_jobs": int(cfg.bench_sweep.n_jobs),
              "grid": list(cfg.bench_sweep.grid), "seeds": list(cfg.bench_sweep.seeds),
              "job_settings": list(cfg.bench_sweep.job), **ways,
              "speedup": round(ratio(ways["sequential"]["wall_seconds"],
                                     ways["parallel"]["wall_seconds"]), 2),
              "max_score_difference": difference}
    publish(result, run_dir / RESULT_FILE, _table)
    return result


def _table(result: dict, path: Path) -> str:
    jobs = result["jobs"]
    rows = {"sequential": "sequential (basic)",
            "parallel": f"parallel (joblib, {result['n_jobs']} at a time)"}
    return "\n".join([
        f"\n{jobs} jobs ({result['task']}), wall time:",
        *markdown_head("launcher", "wall time", "per job"),
        *(f"| {label} | {result[way]['wall_seconds']:.1f} s | "
          f"{result[way]['wall_seconds'] / jobs:.1f} s |" for way, label in rows.items()),
        f"speed-up: {result['speedup']:.2f}x; largest score difference between the ways: "
        f"{result['max_score_difference']:.2g}",
        str(path)])


# What `python -m benchmarks.sweep_launchers` runs: its job on its primary config,
# benchmarks/conf/bench_sweep.yaml.
CONFIG = "bench_sweep"
JOB = Job("benchmarks.sweep_launchers:benchmark_sweep_launchers", RESULT_FILE)

if __name__ == "__main__":
    main(JOB, CONFIG)
