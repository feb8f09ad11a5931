"""hydra/launcher=slurm_gpu through submitit's real SLURM path, against stand-ins for sbatch,
srun and sacct (this machine has no SLURM): the batch script the preset makes (one GPU per job,
the partition from BERTKIT_SLURM_PARTITION, an array of the sweep's jobs) and the jobs run
from it to their results, as a cluster would run them."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import tiny_run_overrides

FAKE_SBATCH = r"""#!/usr/bin/env bash
# sbatch: keep the script, run it in the background once per array index with SLURM's variables.
script="$1"; cp "$script" "$FAKE_SLURM_DIR/sbatch.sh"; id=4242
last=$(sed -n 's/^#SBATCH --array=0-\([0-9]*\)%.*/\1/p' "$script")
common="SLURM_NTASKS=1 SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NODEID=0 SLURM_JOB_NUM_NODES=1"
common="$common SLURM_JOB_NODELIST=localhost"
if [ -z "$last" ]; then
  env $common SLURM_JOB_ID=$id bash "$script" > "$FAKE_SLURM_DIR/job.log" 2>&1 &
else
  for a in $(seq 0 "$last"); do
    env $common SLURM_JOB_ID=$((id + a + 1)) SLURM_ARRAY_JOB_ID=$id SLURM_ARRAY_TASK_ID=$a \
      bash "$script" > "$FAKE_SLURM_DIR/job_$a.log" 2>&1 &
  done
fi
echo "Submitted batch job $id"
"""
FAKE_SRUN = r"""#!/usr/bin/env bash
# srun: drop its options (one task per job here), run the command.
while [ "${1#--}" != "$1" ]; do
  case "$1" in --output|--error) shift 2 ;; *) shift ;; esac
done
exec "$@"
"""
FAKE_SACCT = """#!/usr/bin/env bash
echo "JobID|State|NodeList"
"""


def fake_slurm(directory: Path) -> Path:
    bin_dir = directory / "bin"
    bin_dir.mkdir(parents=True)
    for name, text in [("sbatch", FAKE_SBATCH), ("srun", FAKE_SRUN), ("sacct", FAKE_SACCT)]:
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod((bin_dir / name).stat().st_mode | stat.S_IEXEC)
    return bin_dir


@pytest.mark.slow
def test_slurm_gpu_preset_submits_an_array_that_runs_every_job(glue_dir, vocab_dir, tmp_path):
    data = glue_dir("wnli", n_train=32)
    sweep_dir = tmp_path / "sweep"
    env = {**os.environ, "PATH": f"{fake_slurm(tmp_path)}{os.pathsep}{os.environ['PATH']}",
           "FAKE_SLURM_DIR": str(tmp_path), "BERTKIT_SLURM_PARTITION": "gpu-a100",
           "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    overrides = [o for o in tiny_run_overrides("wnli", data, vocab_dir)
                 if not o.startswith("trainer.learning_rate=")]
    result = subprocess.run(
        [sys.executable, "-m", "bertkit", "-m", *overrides, "trainer.learning_rate=1e-3,3e-4",
         f"hydra.sweep.dir={sweep_dir}", "hydra.sweep.subdir=lr${trainer.learning_rate}",
         f"cache_dir={tmp_path / 'cache'}", "hydra/launcher=slurm_gpu",
         "hydra.launcher.timeout_min=30"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    logs = "".join(p.read_text() for p in tmp_path.glob("job*.log"))
    assert result.returncode == 0, result.stderr[-3000:] + logs[-3000:]

    script = (tmp_path / "sbatch.sh").read_text()
    # One array of the 2 jobs, all at once (the preset's array_parallelism, 64, caps it).
    for directive in ["--partition=gpu-a100", "--gpus-per-node=1", "--ntasks-per-node=1",
                      "--cpus-per-task=8", "--mem=64GB", "--time=30", "--array=0-1%2",
                      "--nodes=1"]:
        assert f"#SBATCH {directive}\n" in script, script
    assert f"{sys.executable} -u -m submitit.core._submit" in script

    for lr in ("0.001", "0.0003"):
        metrics = json.loads((sweep_dir / f"lr{lr}" / "metrics.json").read_text())
        assert metrics["train"]["steps"] == 4
        assert metrics["hyperparameters"]["learning_rate"] == float(lr)
    # Each job ran as its own SLURM array task.
    assert sorted(p.name for p in (sweep_dir / ".submitit").glob("4242_*")) == [
        "4242_0", "4242_1"]
