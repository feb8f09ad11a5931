"""A method's setting swept like any key: `bertkit -m sweep=paper_grid_halving finetuning=llrd
finetuning.layer_lr_decay=1.0,0.9` halves each decay value's grid on its own, every run records
its own decay, and the report shows one system per value; early stopping on a method's run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertkit.jobs import run_job
from bertkit.reporting.cli import main as report_main
from tests.conftest import compose_config, tiny_run_overrides
from tests.sweeps.test_successive_halving import run_bertkit_in_process, tiny_sweep_overrides


@pytest.mark.slow
def test_layer_decay_swept_through_successive_halving(glue_dir, vocab_dir, tmp_path,
                                                       monkeypatch):
    data = glue_dir("wnli", n_train=64)
    sweep_dir = tmp_path / "sweep"
    overrides = [o for o in tiny_sweep_overrides(data, vocab_dir, sweep_dir)
                 if not o.startswith(("trainer.per_device_train_batch_size=", "seed="))]
    run_bertkit_in_process(monkeypatch, "-m", "sweep=paper_grid_halving", *overrides,
                           "trainer.per_device_train_batch_size=8", "seed=1",
                           "finetuning=llrd", "finetuning.layer_lr_decay=1.0,0.9",
                           "hydra.sweep.subdir=decay${finetuning.layer_lr_decay}/"
                           "lr${trainer.learning_rate}/seed${seed}")
    ledger = json.loads((sweep_dir / "halving.json").read_text())
    first = ledger["rungs"][0]["jobs_detail"]
    # Two brackets (one per decay value), each of the 2 learning rates: the best one goes on.
    brackets = {tuple(job["bracket"]) for job in first}
    assert {b for bracket in brackets for b in bracket if b.startswith("finetuning.layer")} == {
        "finetuning.layer_lr_decay=1.0", "finetuning.layer_lr_decay=0.9"}
    for bracket in brackets:
        jobs = [job for job in first if tuple(job["bracket"]) == bracket]
        assert len(jobs) == 2 and sum(job["continues"] for job in jobs) == 1
        best = max(jobs, key=lambda job: job["score"])
        assert best["continues"]

    finished = {}
    for path in sweep_dir.rglob("metrics.json"):
        record = json.loads(path.read_text())
        decay = record["hyperparameters"]["finetuning"]["layer_lr_decay"]
        assert Path(path).relative_to(sweep_dir).parts[0] == f"decay{decay}"
        if record["train"]["complete"]:
            finished[decay] = record["main_value"]
    assert set(finished) == {1.0, 0.9}

    assert report_main([str(sweep_dir)]) == 0
    report = json.loads((sweep_dir / "report" / "report.json").read_text())
    # One row per decay, named by it: the only setting, grid and seed aside, that differs.
    assert report["rows_split_by"]["keys"] == ["finetuning.layer_lr_decay"]
    systems = {system["system"]: system for system in report["systems"]}
    assert set(systems) == {"from_scratch · layer_lr_decay=1", "from_scratch · layer_lr_decay=0.9"}
    for name, system in systems.items():
        decay = float(system["settings"]["finetuning.layer_lr_decay"])
        assert name.endswith(f"={decay:g}")
        chosen = system["tasks"]["wnli"]
        assert chosen["runs_tried"] == 1  # the bracket's survivor only
        assert chosen["run_dirs"][0].startswith(f"decay{decay}/")


@pytest.mark.slow  # a run
def test_early_stopping_stops_a_methods_run(glue_dir, vocab_dir, tmp_path):
    data = glue_dir("wnli", n_train=16, n_dev=8)
    cfg = compose_config(tiny_run_overrides(
        "wnli", data, vocab_dir, **{
            "trainer.max_steps": -1, "trainer.num_train_epochs": 20,
            "trainer.learning_rate": 1e-9, "trainer.eval_strategy": "epoch",
            "trainer.save_strategy": "epoch",
            "trainer.metric_for_best_model": "validation_accuracy",
            "trainer.load_best_model_at_end": True, "early_stopping.patience": 2,
            "finetuning": "llrd", "finetuning.freeze_embeddings": True}))
    record = run_job(cfg, run_dir=tmp_path / "run")
    # lr 1e-9: the dev score never improves, so training stops 2 evaluations after the first.
    assert record["train"]["steps"] == 3 * 2 and record["train"]["planned_steps"] == 20 * 2
    assert record["hyperparameters"]["finetuning"]["layer_lr_decay"] == 0.95
