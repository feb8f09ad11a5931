"""How the benchmarks that train two or three ways side by side in one process run them, written
once: the schedule they read from bench.* (warm-up, timed steps, repeats in alternating order),
the one-process settings they need, a timed trainer.train(), and the clean-up between runs
(docs/speed.md, "How the side-by-side benchmarks time")."""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch
from omegaconf import DictConfig
from transformers import PrinterCallback

from benchmarks.measure import SteadyClock, steady_skip, timed
from bertkit.errors import BertkitError
from bertkit.training.throughput import add_throughput

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Schedule:
    """bench.steps timed steps a run, bench.warmup_steps on a throwaway run first (not timed),
    bench.repeats timed runs a way."""

    steps: int
    warmup_steps: int
    repeats: int

    @classmethod
    def read(cls, bench) -> Schedule:
        schedule = cls(int(bench.steps), int(bench.warmup_steps), int(bench.repeats))
        if schedule.steps < 1 or schedule.warmup_steps < 0 or schedule.repeats < 1:
            raise BertkitError(f"bench: steps ({schedule.steps}) and repeats "
                               f"({schedule.repeats}) must be at least 1, warmup_steps "
                               f"({schedule.warmup_steps}) at least 0")
        return schedule

    def fields(self) -> dict:
        """The result JSON's steps, warmup_steps and repeats."""
        return {"steps": self.steps, "warmup_steps": self.warmup_steps, "repeats": self.repeats}


def alternating(ways: Sequence[str], index: int) -> Sequence[str]:
    """The ways in the order of repeat (seed, batch) `index`: as given, then reversed, so that a
    machine that slows down over time favours no way."""
    return ways if index % 2 == 0 else ways[::-1]


def run_ways(ways: Sequence[str], schedule: Schedule, run: Callable[[str, int, bool], T],
             label: str = "bench") -> dict[str, list[T]]:
    """Each way's warm-up run (not timed), then its timed runs in alternating order: way ->
    run(way, steps, timed) of every repeat."""
    for way in ways if schedule.warmup_steps else ():
        logger.info("%s %s: warm-up, %d steps (not timed)", label, way, schedule.warmup_steps)
        run(way, schedule.warmup_steps, False)
    runs: dict[str, list[T]] = {way: [] for way in ways}
    for repeat in range(schedule.repeats):
        for way in alternating(ways, repeat):
            logger.info("%s %s: timed run %d of %d, %d steps", label, way, repeat + 1,
                        schedule.repeats, schedule.steps)
            runs[way].append(run(way, schedule.steps, True))
    return runs


def one_batch_a_step(trainer: DictConfig, why: str) -> None:
    if trainer.gradient_accumulation_steps != 1:
        raise BertkitError(f"bench: trainer.gradient_accumulation_steps must be 1 (one batch a "
                           f"step, {why})")


def one_process(bench: DictConfig, probe, why: str) -> None:
    """bench.num_threads applied; a launch on several processes refused (probe: its
    TrainingArguments)."""
    if bench.num_threads is not None:
        torch.set_num_threads(int(bench.num_threads))
    if probe.world_size > 1:
        raise BertkitError(f"bench: run on one process ({why})")


def check_steps(way: str, made: int, steps: int, forwards: int | None = None) -> None:
    """The run made its `steps` optimizer steps (and as many training forwards, where
    counted)."""
    if made != steps or forwards not in (None, steps):
        detail = "" if forwards is None else f" ({forwards} training forwards)"
        raise BertkitError(f"bench: the {way} run made {made} steps{detail}, not {steps}")


@dataclass
class TimedTraining:
    output: object  # trainer.train()'s TrainOutput
    seconds: float
    steady: dict  # SteadyClock.figures()
    meter: dict | None  # the throughput meter's record


def train_timed(bench: DictConfig, throughput: DictConfig | None, trainer,
                steps: int) -> TimedTraining:
    """trainer.train() timed between device syncs, with the throughput meter every bertkit run
    carries (`throughput`: the throughput node) and the steady clock (`bench`: the benchmark's
    node); Trainer's end-of-train line left out (the table repeats it)."""
    trainer.remove_callback(PrinterCallback)
    meter = add_throughput(throughput, trainer)
    clock = SteadyClock(steady_skip(bench, steps), steps)
    trainer.add_callback(clock)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    output, seconds = timed(trainer.train)
    return TimedTraining(output, seconds, clock.figures(),
                         meter.record if meter is not None else None)


def release(empty_cache: bool = True) -> None:
    """What a finished run held, freed before the next (and the GPU's cached blocks)."""
    gc.collect()
    if empty_cache and torch.cuda.is_available():
        torch.cuda.empty_cache()


def remove_if_empty(directory: Path) -> None:
    """The Trainers' output_dir, when no run saved anything in it."""
    if directory.is_dir() and not any(directory.iterdir()):
        directory.rmdir()
