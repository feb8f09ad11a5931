"""Successive halving over a sweep's grid (Jamieson & Talwalkar 2016; the rung schedule of
Li et al.'s Hyperband brackets): start every configuration, stop the weaker ones early,
continue the rest.

Every job trains its own whole schedule (learning-rate decay over all its planned steps) but
stops at a share of it: rung k trains to min_fraction * eta**k of the planned steps (the last
rung to the end). After each rung the configurations of a bracket are ranked by their mean dev
score over seeds, the best 1/eta go on from their checkpoint (resume=true), the others stop.
A configuration that survives every rung therefore ends exactly where the full grid's run of
it would have; what is saved is the tail of the stopped ones.

This module holds the pure parts (schedule, identities, ranking, accounting); the Hydra sweeper
that launches the rungs is hydra_plugins/bertkit_halving_sweeper.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bertkit.data.atomic_files import DamagedFile, read_json
from bertkit.data.job_overrides import Overrides, configuration_of
from bertkit.data.metrics_file import FAILED_FILE, METRICS_FILE
from bertkit.errors import BertkitError


def rung_fractions(min_fraction: float, eta: float) -> list[float]:
    """The share of each job's schedule trained by the end of each rung, last one 1.0."""
    if not 0.0 < min_fraction <= 1.0:
        raise BertkitError(f"hydra.sweeper.min_fraction={min_fraction}: expected a share of "
                           f"the schedule in (0, 1]")
    if eta <= 1.0:
        raise BertkitError(f"hydra.sweeper.eta={eta}: expected a number above 1 (the best "
                           f"1/eta of the configurations go on after each rung)")
    fractions, share = [], float(min_fraction)
    while share < 1.0 - 1e-9:
        fractions.append(share)
        share *= eta
    return [*fractions, 1.0]


def bracket_of(overrides: Sequence[str], searched_keys: Iterable[str],
               replicate_keys: Iterable[str]) -> Overrides:
    """What a configuration competes within: its overrides without the searched keys (the
    grid) and the replicate keys, e.g. ("task=rte",). Tasks never compete with each other."""
    return configuration_of(overrides, [*searched_keys, *replicate_keys])


def survivors(scores: dict[Overrides, list[float | None]], eta: float,
              greater_is_better: bool = True) -> list[Overrides]:
    """The configurations of one bracket that go on: the best max(1, floor(n / eta)) by mean
    score over their seeds (failed seeds, None, left out). A configuration whose every seed
    failed never goes on. Ties keep the earlier configuration (grid order)."""
    scored = []
    for order, (config, values) in enumerate(scores.items()):
        finished = [v for v in values if v is not None and math.isfinite(v)]
        if finished:
            mean = sum(finished) / len(finished)
            scored.append((-mean if greater_is_better else mean, order, config))
    keep = max(1, math.floor(len(scores) / eta))
    return [config for _, _, config in sorted(scored)[:keep]]


@dataclass
class JobOutcome:
    """What one job's run directory says after a rung."""

    run_dir: Path
    score: float | None  # main_value on dev; None: the job failed
    steps: int = 0  # optimizer steps trained so far (cumulative over rungs)
    planned_steps: int = 0
    train_batch_size: int = 0
    train_seconds: float = 0.0  # this rung's training time
    error: str | None = None


def read_outcome(run_dir: Path, returned: float | None) -> JobOutcome:
    """A finished job's score is what it returned to Hydra (its main dev metric, what any
    Hydra sweeper reads); its metrics.json adds the compute accounting (steps, batch, time).
    A failed job (it returns None) is read from its failed.json. A job whose file is cut or
    corrupt (a full disk) is a failed job whose error names the file: the rung goes on with
    the others, as it does past any failed job."""
    run_dir = Path(run_dir)
    try:
        return _read_outcome(run_dir, returned)
    except DamagedFile as err:
        return JobOutcome(run_dir, None, error=f"unreadable result: {err}")


def _read_outcome(run_dir: Path, returned: float | None) -> JobOutcome:
    metrics_path, failed_path = run_dir / METRICS_FILE, run_dir / FAILED_FILE
    if returned is None and failed_path.is_file() and metrics_path.is_file():
        # Refused: its directory held a finished run, whose metrics.json is not this job's.
        return JobOutcome(run_dir, None, error=str(read_json(failed_path).get("error")))
    if metrics_path.is_file():
        data = read_json(metrics_path)
        train = data.get("train", {})
        if returned is None or "planned_steps" not in train:
            raise BertkitError(f"{metrics_path}: not a finetuning result (no main_value or "
                               f"train.planned_steps): successive halving ranks finetune "
                               f"runs by their main dev metric")
        return JobOutcome(run_dir, float(returned), int(train["steps"]),
                          int(train["planned_steps"]),
                          int(data["hyperparameters"]["train_batch_size"]),
                          float(train.get("seconds", 0.0)))
    if failed_path.is_file() and returned is None:
        error = read_json(failed_path).get("error", "failed")
        return JobOutcome(run_dir, None, error=str(error))
    return JobOutcome(run_dir, None, error="the job left neither metrics.json nor failed.json")


def set_aside_rung_result(run_dir: Path, rung: int) -> None:
    """Before a job is continued: its metrics.json becomes metrics_rung<k>.json, so that a
    failure in the next rung is not hidden behind the previous rung's result."""
    metrics = Path(run_dir) / "metrics.json"
    if metrics.is_file():
        metrics.replace(metrics.with_name(f"metrics_rung{rung}.json"))


def delete_weights(run_dir: Path, names: Sequence[str]) -> None:
    """A stopped job's checkpoints and model (large, never continued); its scores stay."""
    for name in names:
        shutil.rmtree(Path(run_dir) / name, ignore_errors=True)


def cut_by_grid_order(outcomes: dict[Overrides, JobOutcome],
                      configuration: dict[Overrides, Overrides],
                      bracket: dict[Overrides, Overrides], kept: set[Overrides]) -> bool:
    """Whether a configuration that stopped had the very mean score of one of its bracket that
    went on: then grid order, not the scores, decided between them (survivors' tie rule). On a
    task where nothing has learned by the first rung (every score 0) the cut is arbitrary."""
    scores: dict[tuple[Overrides, Overrides], list[float]] = {}
    for job, outcome in outcomes.items():
        if outcome.score is not None and math.isfinite(outcome.score):
            scores.setdefault((bracket[job], configuration[job]), []).append(outcome.score)
    means = {key: sum(values) / len(values) for key, values in scores.items()}
    went_on = {(group, mean) for (group, config), mean in means.items() if config in kept}
    return any((group, mean) in went_on for (group, config), mean in means.items()
               if config not in kept)


@dataclass
class HalvingLedger:
    """Every rung's jobs, scores and decisions, and the compute they used (halving.json)."""

    fractions: list[float]
    eta: float
    rungs: list[dict] = field(default_factory=list)
    jobs: dict[str, dict] = field(default_factory=dict)  # run_dir -> compute used so far

    def record_rung(self, rung: int, outcomes: dict[Overrides, JobOutcome],
                    configuration: dict[Overrides, Overrides],
                    bracket: dict[Overrides, Overrides], kept: set[Overrides]) -> None:
        entries = []
        for job, outcome in outcomes.items():
            config = configuration[job]
            entries.append({"overrides": list(job), "run_dir": str(outcome.run_dir),
                            "bracket": list(bracket[job]), "score": outcome.score,
                            "steps": outcome.steps, "planned_steps": outcome.planned_steps,
                            "train_seconds": outcome.train_seconds, "error": outcome.error,
                            "continues": config in kept})
            previous = self.jobs.get(str(outcome.run_dir), {})
            self.jobs[str(outcome.run_dir)] = {
                "steps": outcome.steps or previous.get("steps", 0),
                "planned_steps": outcome.planned_steps or previous.get("planned_steps", 0),
                "train_batch_size": (outcome.train_batch_size
                                     or previous.get("train_batch_size", 0)),
                "train_seconds": previous.get("train_seconds", 0.0) + outcome.train_seconds,
            }
        self.rungs.append({"rung": rung, "fraction": self.fractions[rung],
                           "configurations": len(set(configuration[j] for j in outcomes)),
                           "jobs": len(outcomes),
                           "continued_configurations": len(kept),
                           "cut_by_grid_order": cut_by_grid_order(outcomes, configuration,
                                                                  bracket, kept),
                           "jobs_detail": entries})

    def compute(self) -> dict:
        """Training examples (steps x batch) used vs the full grid (every job to its end),
        and training seconds with the full grid's estimated at each job's measured speed."""
        used = full = 0
        seconds_used = seconds_full = 0.0
        for job in self.jobs.values():
            batch = job["train_batch_size"]
            used += job["steps"] * batch
            full += job["planned_steps"] * batch
            seconds_used += job["train_seconds"]
            if job["steps"]:
                seconds_full += job["train_seconds"] / job["steps"] * job["planned_steps"]
        return {"examples_trained": used, "examples_full_grid": full,
                "saved_fraction": (1.0 - used / full) if full else None,
                "train_seconds": round(seconds_used, 2),
                "train_seconds_full_grid_estimate": round(seconds_full, 2),
                "jobs_measured": sum(1 for j in self.jobs.values() if j["planned_steps"])}

    def as_dict(self) -> dict:
        return {"method": "successive halving", "eta": self.eta, "fractions": self.fractions,
                "rungs": self.rungs, "compute": self.compute()}
