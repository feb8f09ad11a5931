"""The W&B runs of one sweep share a group (and only they do), read back from their offline
logs; each run's summary carries what bertkit-report ranks by."""

from __future__ import annotations

import json

import pytest

from tests.sweeps.test_successive_halving import run_bertkit_in_process, tiny_sweep_overrides
from tests.wandb_records import read_offline_run


def test_jobs_of_one_sweep_share_a_wandb_group(glue_dir, vocab_dir, tmp_path, monkeypatch):
    data = glue_dir("wnli", n_train=16)
    groups = {}
    for name in ("first", "second"):
        sweep_dir = tmp_path / name
        overrides = [o for o in tiny_sweep_overrides(data, vocab_dir, sweep_dir)
                     if not o.startswith(("logger=", "trainer.learning_rate=", "seed="))]
        run_bertkit_in_process(monkeypatch, "-m", "sweep=paper_grid", "logger=wandb",
                               "logger.mode=offline", "trainer.learning_rate=1e-3", "seed=1",
                               *overrides, wandb_mode="offline")
        runs = sorted(sweep_dir.rglob("offline-run-*"))
        assert len(runs) == 2  # batch 8 and 16
        logged = [read_offline_run(run) for run in runs]
        groups[name] = {entry["group"] for entry in logged}
        for entry, run in zip(logged, runs, strict=True):
            assert "sweep:paper_grid" in entry["tags"]
            metrics = json.loads((run.parents[1] / "metrics.json").read_text())
            assert entry["summary"]["main_metric"] == "accuracy"
            assert entry["summary"]["main_value"] == pytest.approx(metrics["main_value"])
            assert entry["summary"]["train/complete"] is True
            assert entry["summary"]["train/planned_steps"] == metrics["train"]["planned_steps"]
    assert groups == {"first": {"paper_grid-glue-wnli-first"},
                      "second": {"paper_grid-glue-wnli-second"}}
