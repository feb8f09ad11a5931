"""The training clock: seconds a run has spent training, across resumes.

One clock per run, shared by what reads time during training (the time budget's schedule and
stop, the held-out evaluation's interval). Measurement (bertkit's own held-out evaluations)
runs inside `paused()`, so how often a run is measured does not change how much it trains.
`time_fn` is injectable so that tests drive it with a fake clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class TrainingClock:
    def __init__(self, time_fn: Callable[[], float] = time.monotonic):
        self.time_fn = time_fn
        self.carried = 0.0  # seconds spent before a resume (read from the checkpoint)
        self._started: float | None = None
        self._paused = 0.0  # seconds spent paused since start()

    def start(self, carried: float = 0.0) -> None:
        """Starts (or restarts, on resume) counting, on top of `carried` earlier seconds."""
        self.carried = float(carried)
        self._started = self.time_fn()
        self._paused = 0.0

    @property
    def running(self) -> bool:
        return self._started is not None

    def elapsed(self) -> float:
        """Training seconds so far: earlier runs' plus this one's, less the paused time."""
        if self._started is None:
            return self.carried
        return self.carried + (self.time_fn() - self._started) - self._paused

    @contextmanager
    def paused(self) -> Iterator[None]:
        began = self.time_fn()
        try:
            yield
        finally:
            self._paused += self.time_fn() - began
