"""Successive halving: the rung schedule, who goes on, the compute accounting, a run stopped at
a share of its schedule and continued, and the sweeper end to end."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from bertkit import cli
from bertkit.errors import BertkitError
from bertkit.jobs import run_job
from bertkit.reporting.cli import main as report_main
from bertkit.sweeps.halving import (
    HalvingLedger,
    JobOutcome,
    bracket_of,
    configuration_of,
    read_outcome,
    rung_fractions,
    survivors,
)
from tests.conftest import compose_config, tiny_run_overrides


@pytest.mark.parametrize("name,returned", [("metrics.json", 0.7), ("failed.json", None)])
def test_a_result_file_cut_short_is_a_failed_job_that_names_it(name, returned, tmp_path):
    """Not a traceback, nor the end of the sweep: the rung ranks the other jobs."""
    (tmp_path / name).write_text('{"main_value": 0.7, "tra')
    outcome = read_outcome(tmp_path, returned)
    assert outcome.score is None
    assert outcome.error.startswith(f"unreadable result: {tmp_path / name}: not valid JSON")


def test_rung_fractions():
    assert rung_fractions(0.25, 2) == [0.25, 0.5, 1.0]
    assert rung_fractions(1 / 9, 3) == pytest.approx([1 / 9, 1 / 3, 1.0])
    assert rung_fractions(0.3, 2) == [0.3, 0.6, 1.0]  # 1.2 is capped at the whole schedule
    assert rung_fractions(1.0, 2) == [1.0]
    with pytest.raises(BertkitError, match="min_fraction=0"):
        rung_fractions(0, 2)
    with pytest.raises(BertkitError, match="eta=1"):
        rung_fractions(0.25, 1)


def test_configurations_and_brackets():
    job = ("task=rte", "trainer.learning_rate=2e-5", "trainer.per_device_train_batch_size=32",
           "seed=3", "+extra=1")
    searched = ["trainer.learning_rate", "trainer.per_device_train_batch_size"]
    assert configuration_of(job, ["seed"]) == (
        "task=rte", "trainer.learning_rate=2e-5", "trainer.per_device_train_batch_size=32",
        "+extra=1")
    assert bracket_of(job, searched, ["seed"]) == ("task=rte", "+extra=1")


def test_survivors_rank_by_mean_over_seeds():
    scores = {("a",): [0.70, 0.80], ("b",): [0.90, 0.50], ("c",): [0.74, None],
              ("d",): [None, None], ("e",): [0.10, 0.20], ("f",): [0.60, 0.60]}
    # means: a 0.75, b 0.70, c 0.74 (its finished seed), d never finished, e 0.15, f 0.60
    assert survivors(scores, eta=2) == [("a",), ("c",), ("b",)]
    assert survivors(scores, eta=3) == [("a",), ("c",)]
    assert survivors(scores, eta=100) == [("a",)]  # at least one goes on
    assert survivors(scores, eta=2, greater_is_better=False) == [("e",), ("f",), ("b",)]
    tie = {("x",): [0.5], ("y",): [0.5], ("z",): [0.5], ("w",): [0.5]}
    assert survivors(tie, eta=2) == [("x",), ("y",)]  # grid order breaks ties


def test_ledger_compute_against_hand_numbers(tmp_path):
    ledger = HalvingLedger([0.5, 1.0], eta=2)
    a, b = ("lr=1",), ("lr=2",)
    configuration, bracket = {a: a, b: b}, {a: (), b: ()}
    ledger.record_rung(0, {a: JobOutcome(tmp_path / "a", 0.8, 5, 10, 16, 2.0),
                           b: JobOutcome(tmp_path / "b", 0.6, 3, 6, 32, 3.0)},
                       configuration, bracket, kept={a})
    ledger.record_rung(1, {a: JobOutcome(tmp_path / "a", 0.9, 10, 10, 16, 2.5)},
                       configuration, bracket, kept={a})
    compute = ledger.compute()
    # used: a 10 steps x 16 + b 3 x 32 = 256; full grid: a 10 x 16 + b 6 x 32 = 352
    assert compute["examples_trained"] == 256
    assert compute["examples_full_grid"] == 352
    assert compute["saved_fraction"] == pytest.approx(1 - 256 / 352)
    assert compute["train_seconds"] == pytest.approx(7.5)
    # a: 4.5 s for 10 of 10 steps; b: 3 s for 3 of 6 steps -> 6 s for all of them
    assert compute["train_seconds_full_grid_estimate"] == pytest.approx(10.5)
    assert [r["continued_configurations"] for r in ledger.rungs] == [1, 1]
    assert [r["cut_by_grid_order"] for r in ledger.rungs] == [False, False]


def test_a_cut_between_equal_scores_is_recorded_as_made_by_grid_order(tmp_path):
    """CoLA's calibration: every configuration at MCC 0 after the first rung, so the ones that
    went on were the first in the grid."""
    ledger = HalvingLedger([0.5, 1.0], eta=2)
    a, b, c = ("lr=1",), ("lr=2",), ("lr=3",)
    configuration, bracket = {a: a, b: b, c: c}, {a: (), b: (), c: ()}
    outcome = {name: JobOutcome(tmp_path / name[0], score, 5, 10, 16, 1.0)
               for name, score in ((a, 0.0), (b, 0.0), (c, -0.1))}
    ledger.record_rung(0, outcome, configuration, bracket, kept={a})
    ledger.record_rung(1, {a: outcome[a]}, configuration, bracket, kept={a})
    separated = {a: outcome[a], b: JobOutcome(tmp_path / "b", 0.3, 5, 10, 16, 1.0)}
    ledger.record_rung(0, separated, configuration, bracket, kept={b})

    # Tasks never compete: equal scores in two brackets decide nothing between them.
    two_tasks = {a: ("task=rte",), b: ("task=mrpc",)}
    ledger.record_rung(0, {a: outcome[a], b: outcome[b]}, configuration, two_tasks,
                       kept={a, b})
    ledger.record_rung(0, {a: outcome[a], c: JobOutcome(tmp_path / "c", 0.0, 5, 10, 16, 1.0)},
                       configuration, {a: ("task=rte",), c: ("task=mrpc",)}, kept={a})

    assert [r["cut_by_grid_order"] for r in ledger.rungs] == [True, False, False, False, False]


@pytest.mark.slow
@pytest.mark.parametrize(("fraction", "eval_strategy", "stop_step"), [
    (0.3, "no", 4),  # mid-epoch
    (0.5, "epoch", 6),  # at the end of epoch 1, where the uninterrupted run evaluates
])
def test_stopped_run_continues_to_exactly_the_uninterrupted_run(
        fraction, eval_strategy, stop_step, glue_dir, vocab_dir, tmp_path):
    """train_fraction stops at ceil(share x planned steps) with a checkpoint; resume=true with
    the whole schedule ends where a run that never stopped ends, weights and scores. At an
    epoch's end the checkpoint must be taken after that epoch's evaluation, which draws from
    the RNG (each DataLoader iterator takes a seed), as the uninterrupted run does."""
    data = glue_dir("mrpc", n_train=48)
    overrides = tiny_run_overrides("mrpc", data, vocab_dir, **{
        "trainer.max_steps": -1, "trainer.num_train_epochs": 2,  # 48 / 8 x 2 = 12 steps
        "trainer.eval_strategy": eval_strategy})
    reference_dir = tmp_path / "reference"
    run_job(compose_config(overrides), run_dir=reference_dir)

    run_dir = tmp_path / "run"
    run_job(compose_config(overrides + [f"train_fraction={fraction}"]), run_dir=run_dir)
    stopped = json.loads((run_dir / "metrics.json").read_text())
    assert stopped["train"]["steps"] == math.ceil(fraction * 12) == stop_step
    assert stopped["train"]["planned_steps"] == 12
    assert stopped["train"]["complete"] is False
    assert (run_dir / "checkpoints" / f"checkpoint-{stop_step}").is_dir()

    run_job(compose_config(overrides + ["train_fraction=1.0", "resume=true"]),
                  run_dir=run_dir)
    continued = json.loads((run_dir / "metrics.json").read_text())
    reference = json.loads((reference_dir / "metrics.json").read_text())
    assert continued["train"]["steps"] == 12 and continued["train"]["complete"] is True
    assert continued["validation"] == reference["validation"]
    weights = load_file(run_dir / "model" / "model.safetensors")
    for name, tensor in load_file(reference_dir / "model" / "model.safetensors").items():
        assert weights[name].allclose(tensor, atol=1e-6), name


def test_train_fraction_out_of_range(glue_dir, vocab_dir, tmp_path):
    data = glue_dir("mrpc", n_train=16)
    cfg = compose_config(tiny_run_overrides("mrpc", data, vocab_dir) + ["train_fraction=1.5"])
    with pytest.raises(BertkitError, match=r"train_fraction=1.5: expected a number in \(0, 1\]"):
        run_job(cfg, run_dir=tmp_path / "run")


def run_bertkit_in_process(monkeypatch, *overrides: str, wandb_mode: str = "disabled") -> None:
    """bertkit as the command line runs it, in this process (so that a test can force one
    job to fail); Hydra reads sys.argv."""
    monkeypatch.setattr(sys, "argv", ["bertkit", *overrides])
    monkeypatch.setenv("WANDB_MODE", wandb_mode)
    cli.main()


def tiny_sweep_overrides(data: Path, vocab: Path, sweep_dir: Path) -> list[str]:
    overrides = tiny_run_overrides("wnli", data, vocab, **{
        "trainer.max_steps": -1, "trainer.num_train_epochs": 2})
    narrowed = [o for o in overrides if not o.startswith(("trainer.learning_rate=",
                                                          "trainer.per_device_train_batch_size="))]
    return [*narrowed, "trainer.learning_rate=1e-3,3e-4",
            "trainer.per_device_train_batch_size=8,16", "seed=1,2",
            f"hydra.sweep.dir={sweep_dir}"]


@pytest.mark.slow
def test_halving_sweep_end_to_end(halving_sweep):
    """2 x 2 grid x 2 seeds, min_fraction 0.25, eta 2: 4 -> 2 -> 1 configurations; the
    survivors' scores are those of their own jobs; stopped jobs lose their checkpoints; the
    compute saved is recomputed from the jobs' metrics files. The shared sweep
    (tests.runs.halving_sweep: the `bertkit` command, W&B offline)."""
    sweep_dir = halving_sweep / "sequential"
    ledger = json.loads((sweep_dir / "halving.json").read_text())
    assert ledger["fractions"] == [0.25, 0.5, 1.0]
    assert [(r["configurations"], r["jobs"], r["continued_configurations"])
            for r in ledger["rungs"]] == [(4, 8, 2), (2, 4, 1), (1, 2, 1)]

    metrics = {p.parent.relative_to(sweep_dir).as_posix(): json.loads(p.read_text())
               for p in sweep_dir.rglob("metrics.json")}
    assert len(metrics) == 8
    for rung in ledger["rungs"][:2]:
        means: dict[str, list[float]] = {}
        for job in rung["jobs_detail"]:
            means.setdefault(str(Path(job["run_dir"]).parent), []).append(job["score"])
        ranked = sorted(means, key=lambda c: -sum(means[c]) / len(means[c]))
        kept = {str(Path(j["run_dir"]).parent) for j in rung["jobs_detail"] if j["continues"]}
        assert kept == set(ranked[:len(means) // 2])

    used = full = 0
    for name, run in metrics.items():
        batch = run["hyperparameters"]["train_batch_size"]
        planned = math.ceil(64 / batch) * 2
        assert run["train"]["planned_steps"] == planned
        used += run["train"]["steps"] * batch
        full += planned * batch
        job_dir = sweep_dir / name
        if run["train"]["complete"]:
            assert run["train"]["steps"] == planned
            assert (job_dir / "metrics_rung0.json").is_file()
            assert (job_dir / "metrics_rung1.json").is_file()
        else:
            assert run["train"]["steps"] < planned
            assert not (job_dir / "checkpoints").exists() and not (job_dir / "model").exists()
    assert sum(r["train"]["complete"] for r in metrics.values()) == 2
    assert ledger["compute"]["examples_trained"] == used
    assert ledger["compute"]["examples_full_grid"] == full
    assert ledger["compute"]["saved_fraction"] == pytest.approx(1 - used / full)
    assert 0.4 < ledger["compute"]["saved_fraction"] < 0.8

    # The report ranks only the finished runs and shows the rungs and the compute saved.
    assert report_main([str(sweep_dir)]) == 0
    report = json.loads((sweep_dir / "report" / "report.json").read_text())
    (system,) = report["systems"]
    survivor = next(name for name, run in metrics.items() if run["train"]["complete"])
    assert system["tasks"]["wnli"]["run_dirs"] == [
        f"{survivor.rsplit('/', 1)[0]}/seed{s}" for s in (1, 2)]
    assert system["tasks"]["wnli"]["runs_tried"] == 2
    assert len(report["stopped"]) == 6
    (halving,) = report["halving"]
    assert halving["path"] == "halving.json"
    md = (sweep_dir / "report" / "report.md").read_text()
    assert "## Successive halving" in md
    assert "| 0 | 25% | 4 | 8 | 2 |" in md and "| 2 | 100% | 1 | 2 | 1 |" in md
    assert (f"Training examples: {used:,} of {full:,} for the full grid "
            f"(**{1 - used / full:.0%} saved**)") in md
    assert "6 run(s) stopped part-way by successive halving are not in the tables." in md
