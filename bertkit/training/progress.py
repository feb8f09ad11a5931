"""Progress bars: drawn on a terminal, never written into a log file.

tqdm draws a bar by rewriting its line with carriage returns (and, for nested bars, ANSI cursor
moves): on a terminal that is one line that moves; in a file (a redirected log, a SLURM
output, CI, `make ... > log`) every frame is kept. The `progress_bars` key (conf/config.yaml)
decides once per job, at its entry (bertkit.jobs.run_job):

    auto   bars when the standard error, where tqdm draws, is a terminal; else none
    true   every bar, terminal or not (datasets' bar of each map in pretraining's stages too)
    false  no bar

Without bars, each library is switched off by its own switch (datasets, transformers,
huggingface_hub), and Trainer gets disable_tqdm=true (unless trainer.disable_tqdm is set):
its log lines are then printed as plain lines (Trainer's PrinterCallback).

A job's data preparation in several stages (pretraining's: reading the corpus, tokenising,
building instances, ...) runs each stage in `preprocessing_stage`: one line when the stage
ends, with its count and time, in place of datasets' bar for each map of the stage (several
per stage: a map, a filter, a copy per duplicate); progress_bars=true keeps those bars too.
"""

from __future__ import annotations

import logging
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import datasets
import huggingface_hub.utils
import transformers.utils.logging
from omegaconf import DictConfig

logger = logging.getLogger(__name__)

# The choices of progress_bars (bertkit.config_schema reads them).
PROGRESS_BARS = ("auto", True, False)


def stream_is_terminal() -> bool:
    """Whether tqdm's stream (the standard error) is a terminal."""
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


def progress_bars_shown(setting) -> bool:
    """Whether bars are shown under progress_bars=`setting` ("auto", True or False)."""
    return stream_is_terminal() if setting == "auto" else setting is True


def every_bar_shown(setting) -> bool:
    """progress_bars=true: the libraries' bars inside a preprocessing stage too."""
    return setting is True


def apply_progress_bars(cfg: DictConfig) -> bool:
    """Switches the libraries' bars on or off for this job; returns whether they are shown.
    An environment variable a user set (HF_DATASETS_DISABLE_PROGRESS_BARS,
    HF_HUB_DISABLE_PROGRESS_BARS) keeps priority, as the libraries intend, without their
    warning that it does."""
    shown = progress_bars_shown(cfg.progress_bars)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if shown:
            datasets.enable_progress_bars()
            transformers.utils.logging.enable_progress_bar()
            huggingface_hub.utils.enable_progress_bars()
        else:
            datasets.disable_progress_bars()
            transformers.utils.logging.disable_progress_bar()
            huggingface_hub.utils.disable_progress_bars()
    return shown


@dataclass
class StageCount:
    """What a stage made, said in its line: set `count` and `unit` inside the stage."""

    count: int | None = None
    unit: str = ""


@contextmanager
def preprocessing_stage(name: str, *, library_bars: bool = False,
                        log: logging.Logger = logger) -> Iterator[StageCount]:
    """One stage of a job's data preparation: datasets' bars off inside it (unless
    `library_bars`), and one line when it ends: `<name>: <count> <unit> (<seconds> s)`."""
    hidden = not library_bars and datasets.is_progress_bar_enabled()
    if hidden:
        datasets.disable_progress_bars()
    made = StageCount()
    started = time.perf_counter()
    try:
        yield made
    finally:
        if hidden:
            datasets.enable_progress_bars()
    what = "done" if made.count is None else f"{made.count:,} {made.unit}".rstrip()
    log.info("%s: %s (%.1f s)", name, what, time.perf_counter() - started)
