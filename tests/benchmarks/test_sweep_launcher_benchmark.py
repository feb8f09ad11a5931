"""`python -m benchmarks.sweep_launchers` end to end on a tiny model: the same grid launched
both ways, the same jobs scored alike, and the ratio computed from the wall times it records."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.doc_commands import REPO


def run_benchmark(tmp_path, *overrides: str) -> None:
    """The command as the Makefile runs it, from the repository's root."""
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path / "wandb"),
           "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "benchmarks.sweep_launchers", *overrides],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.mark.slow
def test_sweep_benchmark_launches_the_grid_both_ways(glue_dir, vocab_dir, tmp_path):
    data = glue_dir("wnli", n_train=32)
    run_dir = tmp_path / "bench"
    run_benchmark(tmp_path, "task=wnli", f"task.data_dir={data}",
                  "model=scratch_tiny", f"model.tokenizer={vocab_dir}",
                  "model.config.hidden_size=32", "model.config.intermediate_size=64",
                  "bench_sweep.grid=['trainer.learning_rate=1e-3,3e-4']",
                  "bench_sweep.seeds=[1,2]", f"cache_dir={tmp_path / 'cache'}",
                  f"hydra.run.dir={run_dir}")
    result = json.loads((run_dir / "sweep_bench.json").read_text())
    assert result["jobs"] == 4 and result["n_jobs"] == 2
    for way in ("sequential", "parallel"):
        scores = result[way]["scores"]
        assert len(scores) == 4
        on_disk = {p.parent.relative_to(run_dir / way).as_posix():
                   json.loads(p.read_text())["main_value"]
                   for p in (run_dir / way).rglob("metrics.json")}
        assert scores == on_disk
    assert result["sequential"]["scores"].keys() == result["parallel"]["scores"].keys()
    assert result["max_score_difference"] == max(
        abs(result["sequential"]["scores"][j] - result["parallel"]["scores"][j])
        for j in result["sequential"]["scores"])
    assert result["speedup"] == round(result["sequential"]["wall_seconds"]
                                      / result["parallel"]["wall_seconds"], 2)
    assert result["parallel"]["launcher"] == ["hydra/launcher=local_parallel",
                                              "hydra.launcher.n_jobs=2"]
    # The warm-up tokenised; neither way did.
    warmup = (run_dir / "warmup.log").read_text()
    assert "] - tokenised train" in warmup
    for way in ("sequential", "parallel"):
        logs = "".join(p.read_text() for p in (run_dir / way).rglob("cli.log"))
        assert "] - tokenised" not in logs and "] - read train from the cache" in logs
