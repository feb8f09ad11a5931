"""The benchmarks' steady clock: it times the steps after the first `skip` alone, so that a
short benchmark does not charge one-time costs (workers starting, compiling) to every step."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks import measure
from benchmarks.measure import SteadyClock, steady_figures, steady_skip


def test_the_clock_spans_the_steps_after_the_skipped_ones(monkeypatch):
    # Step i ends at second i**2: the steps after step 2 of 5 span 25 - 4 seconds.
    now = iter(float(step * step) for step in (2, 5))
    monkeypatch.setattr(measure.time, "perf_counter", lambda: next(now))
    clock = SteadyClock(skip=2, steps=5)
    for step in range(1, 6):
        clock.on_step_end(None, SimpleNamespace(global_step=step, max_steps=5), None)
    assert clock.figures() == {"steady_seconds": 21.0, "steady_share": 3 / 5}


def test_without_a_skip_there_is_no_steady_figure():
    clock = SteadyClock(skip=0, steps=5)
    for step in range(1, 6):
        clock.on_step_end(None, SimpleNamespace(global_step=step, max_steps=5), None)
    assert clock.figures()["steady_seconds"] is None
    runs = [{**clock.figures()}]
    assert steady_figures(runs, 100, 1e12, 1e15) == {"steady_samples_per_second": None,
                                                     "steady_mfu": None}


@pytest.mark.parametrize(("skip", "steps", "expected"), [(10, 50, 10), (10, 10, 0), (0, 5, 0),
                                                         (None, 5, 0), (3, 2, 0)])
def test_a_skip_needs_steps_after_it(skip, steps, expected):
    assert steady_skip({"steady_skip": skip}, steps) == expected


def test_steady_figures_are_the_median_over_repeats_in_proportion_to_the_steps():
    runs = [{"steady_seconds": seconds, "steady_share": 0.8} for seconds in (2.0, 4.0, 3.0)]
    figures = steady_figures(runs, samples=1000, flops=6e12, peak=1e13)
    assert figures["steady_samples_per_second"] == pytest.approx(800 / 3.0)
    assert figures["steady_mfu"] == pytest.approx(6e12 * 0.8 / (3.0 * 1e13))
