"""A multirun prints W&B's banner once, not once per job: a real `bertkit -m` process (Hydra's
basic launcher, W&B offline and not silenced), its output read as a user's log holds it."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import tiny_run_overrides

# What W&B prints about a run when it opens and closes it (wandb 0.2x-0.3x wording).
BANNER = ("Tracking run with wandb version", "Run data is saved locally in", "Find logs at",
          "You can sync this run to the cloud", "Run summary:")


@pytest.mark.slow  # a process with three finetunes, each a W&B run
def test_a_sweep_prints_the_wandb_banner_once_and_where_each_run_went(glue_dir, vocab_dir,
                                                                       tmp_path):
    sweep_dir = tmp_path / "sweep"
    overrides = tiny_run_overrides("wnli", glue_dir("wnli", n_train=16), vocab_dir,
                                   logger="wandb", **{"trainer.max_steps": 2})
    env = {**os.environ, "WANDB_MODE": "offline"}
    env.pop("WANDB_SILENT", None)  # the tests' quiet W&B (conftest) would hide the banner
    result = subprocess.run(
        [sys.executable, "-m", "bertkit", "-m", *overrides, "seed=1,2,3",
         f"hydra.sweep.dir={sweep_dir}"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    runs = sorted(sweep_dir.rglob("offline-run-*"))
    assert len(runs) == 3, output
    for line in BANNER:
        assert output.count(line) == 1, (line, output)
    assert output.count("no credentials found") == 1, output
    # Each job still says where its run went, in one line of its own.
    where = re.findall(r"W&B run: (\S+)", output)
    assert len(where) == 3 and len(set(where)) == 3, output
    assert sorted(os.path.dirname(path) for path in where) == [str(run) for run in runs]
