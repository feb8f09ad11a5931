"""What a job prints, read from a real `bertkit` process: written into a file or a pipe (a
redirected log, SLURM, CI) it holds no progress-bar frames (no carriage return, no ANSI
escape); on a terminal, pretraining's data preparation shows one line per stage and no bar of
datasets' maps; progress_bars=true brings every bar back."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios

import datasets
import huggingface_hub.utils
import pytest
import transformers.utils.logging

from bertkit.pretraining.run import STAGES
from bertkit.training.run import apply_progress_bars, build_training_arguments
from tests.conftest import compose_config, tiny_run_overrides
from tests.pretraining.test_pretrain_recipe import small_run

# The frames of a tqdm bar, whoever draws it: "45%|####  | 9/20", "300 examples [00:00, ...".
BAR_FRAME = re.compile(r"\d+%\||\d+ examples \[|examples/s\]|it/s\]|s/it\]")
ESCAPES = ("\r", "\x1b[")
# Trainer's log lines when it draws no bar (PrinterCallback): the training loss among them.
PLAIN_LOSS_LINE = re.compile(r"^\{'loss': ", re.MULTILINE)
# The tiny runs let progress_bars decide Trainer's bar (their fixtures turn it off).
DECIDED = ["trainer.disable_tqdm=null"]


def bertkit_command(overrides: list[str], run_dir) -> list[str]:
    return [sys.executable, "-m", "bertkit", *overrides, *DECIDED, f"hydra.run.dir={run_dir}"]


def environment() -> dict:
    return {**os.environ, "WANDB_MODE": "disabled"}


def run_into_file(overrides: list[str], tmp_path) -> str:
    """The job's standard output and error, both written into one file, as `> log 2>&1`."""
    log = tmp_path / "job.log"
    with log.open("wb") as out:
        result = subprocess.run(bertkit_command(overrides, tmp_path / "run"), stdout=out,
                                stderr=subprocess.STDOUT, env=environment(), cwd=tmp_path,
                                timeout=600)
    text = log.read_bytes().decode("utf-8", errors="replace")  # carriage returns kept
    assert result.returncode == 0, text
    return text


def run_on_terminal(overrides: list[str], tmp_path, timeout: float = 600) -> str:
    """The job's output with its standard output and error a terminal (a pseudo-terminal)."""
    controller, terminal = pty.openpty()
    # A terminal of 24 x 120 characters (a new pseudo-terminal has none: tqdm draws nothing).
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    process = subprocess.Popen(bertkit_command(overrides, tmp_path / "run"), stdout=terminal,
                               stderr=terminal, stdin=subprocess.DEVNULL, env=environment(),
                               cwd=tmp_path)
    os.close(terminal)
    chunks = []
    while True:
        ready, _, _ = select.select([controller], [], [], timeout)
        if not ready:
            process.kill()
            pytest.fail("the job printed nothing for too long")
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # the job closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(controller)
    text = b"".join(chunks).decode("utf-8", errors="replace")
    assert process.wait(timeout=60) == 0, text
    return text


def bar_frames(text: str) -> list[str]:
    """Every frame a progress bar drew (frames end at a carriage return or a new line)."""
    return [frame for frame in re.split(r"[\r\n]", text) if BAR_FRAME.search(frame)]


def assert_no_bar_frames(text: str) -> None:
    for escape in ESCAPES:
        assert escape not in text, f"{escape!r} in the log:\n{text}"
    assert not bar_frames(text), text


class Stream:
    def __init__(self, terminal: bool):
        self.terminal = terminal

    def isatty(self) -> bool:
        return self.terminal

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


@pytest.mark.parametrize(("setting", "terminal", "shown"), [
    ("auto", True, True), ("auto", False, False), ("true", False, True),
    ("false", True, False)])
def test_progress_bars_decide_every_librarys_bars(setting, terminal, shown, glue_dir, vocab_dir,
                                                  tmp_path, monkeypatch):
    cfg = compose_config([*tiny_run_overrides("rte", glue_dir("rte"), vocab_dir), *DECIDED,
                          f"progress_bars={setting}"])
    monkeypatch.setattr(sys, "stderr", Stream(terminal))
    try:
        assert apply_progress_bars(cfg) is shown
        assert datasets.is_progress_bar_enabled() is shown
        assert transformers.utils.logging.is_progress_bar_enabled() is shown
        assert huggingface_hub.utils.are_progress_bars_disabled() is not shown
        assert build_training_arguments(cfg, tmp_path,
                                        []).disable_tqdm is not shown
    finally:  # the libraries' switches are the process's: back to their defaults
        datasets.enable_progress_bars()
        transformers.utils.logging.enable_progress_bar()
        huggingface_hub.utils.enable_progress_bars()
    # trainer.disable_tqdm, when set, decides Trainer's bar.
    cfg = compose_config([*tiny_run_overrides("rte", glue_dir("rte"), vocab_dir),
                          f"progress_bars={setting}"])  # the fixture's disable_tqdm=true
    assert build_training_arguments(cfg, tmp_path, []).disable_tqdm is True


@pytest.mark.slow
def test_a_finetune_logged_to_a_file_has_plain_lines_only(glue_dir, vocab_dir, tmp_path):
    text = run_into_file(tiny_run_overrides("rte", glue_dir("rte"), vocab_dir), tmp_path)
    assert_no_bar_frames(text)
    assert PLAIN_LOSS_LINE.search(text), text  # the loss lines are still there
    assert "rte: accuracy = " in text


@pytest.mark.slow
def test_pretraining_logged_to_a_file_has_plain_lines_and_one_per_stage(tmp_path):
    text = run_into_file(small_run(**{"trainer.max_steps": 3}), tmp_path)
    assert_no_bar_frames(text)
    assert PLAIN_LOSS_LINE.search(text), text
    for stage in STAGES[:2] + STAGES[3:]:  # the vocabulary of small_run is given: no stage
        assert len(re.findall(rf"{re.escape(stage)}: ", text)) == 1, (stage, text)


@pytest.mark.slow
def test_pretraining_on_a_terminal_shows_one_line_per_stage(tmp_path):
    text = run_on_terminal(small_run(**{"trainer.max_steps": 3}), tmp_path)
    for stage in STAGES:
        assert len(re.findall(rf"{re.escape(stage)}: ", text)) <= 1, (stage, text)
    assert re.search(rf"{re.escape(STAGES[-1])}: \d+ sequences", text), text
    # No bar of datasets' maps (each stage runs several); Trainer's own bar is drawn.
    frames = bar_frames(text)
    assert not [frame for frame in frames if "examples" in frame], text
    assert [frame for frame in frames if "3/3 [" in frame], text


@pytest.mark.slow
def test_progress_bars_true_draws_every_bar_into_a_file(glue_dir, vocab_dir, tmp_path):
    text = run_into_file([*tiny_run_overrides("rte", glue_dir("rte"), vocab_dir),
                          "progress_bars=true"], tmp_path)
    assert "\r" in text
    assert [frame for frame in bar_frames(text) if "4/4 [" in frame], text  # Trainer's bar
