"""Interrupting is safe and quiet, and a finished run keeps what users keep (issue 61, items 6
and 7), for every task family (bertkit.tasks.FAMILIES) and pretraining:

- Ctrl-C (SIGINT) during training saves a checkpoint at the step's end and stops (exit status
  130: an interrupted run, not a failure); the command prints one line with the command that
  resumes it, a second Ctrl-C stops at once in one line, never a traceback;
- the resumed run says in one line where it resumed from, reports no tied weight as a missing
  key, and continues the same W&B run (same id, same name);
- the finished run keeps model/ and its records and no checkpoint-* (unless
  keep_checkpoints=true); a run cut by train_fraction keeps its checkpoint; a smoke run none.

One interrupted-then-resumed run per kind (module fixture) serves every test that reads it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
from collections import namedtuple
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from bertkit.errors import BertkitError
from bertkit.jobs import check_finished_run, run_job
from bertkit.reporting import wandb_log
from bertkit.tasks import FAMILIES
from bertkit.training.stop_and_resume import Preempted, PreemptionCallback, scan_checkpoints
from bertkit.training.trainer import BertkitTrainer
from tests.conftest import compose_config, tiny_run_overrides
from tests.family_fixtures import tiny_family_run
from tests.pretraining.test_pretrain_recipe import tiny_pretraining_overrides
from tests.wandb_records import read_offline_run

KINDS = [*sorted(FAMILIES), "pretrain"]
STEPS, INTERRUPT_AT = 4, 2  # optimizer steps of each run; the training step Ctrl-C comes in
SIZES = (16, 8, 8)  # examples of the training, dev and test splits
SETTINGS = {"trainer.max_steps": STEPS, "trainer.per_device_train_batch_size": 4,
            "trainer.gradient_accumulation_steps": 1, "trainer.save_strategy": "steps",
            "trainer.save_steps": STEPS, "trainer.eval_strategy": "no",
            "trainer.load_best_model_at_end": False, "trainer.logging_steps": 1,
            "logger": "wandb", "logger.mode": "offline"}


def kind_overrides(kind: str, tmp_path: Path) -> list[str]:
    if kind == "pretrain":
        return tiny_pretraining_overrides(**{
            **SETTINGS, "logger": "wandb", "model.config.hidden_size": 32,
            "model.config.intermediate_size": 64, "trainer.warmup_steps": 0,
            "cache_dir": tmp_path / "cache"})
    return tiny_family_run(kind, tmp_path, SIZES, **SETTINGS)[0]


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@dataclass
class InterruptedRun:
    run_dir: Path
    interrupted: Preempted | None  # None: Ctrl-C did not end it as an interrupted run
    after_interrupt: set[str]  # the checkpoints right after the interrupt
    resumed_lines: list[str] = field(default_factory=list)  # bertkit's and transformers' log


def ctrl_c_at(monkeypatch, step: int, times: int = 1) -> None:
    """Ctrl-C (SIGINT to this process) `times` times as the step-th training step starts."""
    original, calls = BertkitTrainer.training_step, {"n": 0}

    def step_with_ctrl_c(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == step:
            for _ in range(times):
                os.kill(os.getpid(), signal.SIGINT)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(BertkitTrainer, "training_step", step_with_ctrl_c)


@pytest.fixture(scope="module")
def interrupted_runs(tmp_path_factory):
    """{kind: InterruptedRun}, made on first use: Ctrl-C at step 2 of 4, then resume=auto."""
    runs: dict[str, InterruptedRun] = {}

    def make(kind: str) -> InterruptedRun:
        if kind in runs:
            return runs[kind]
        tmp_path = tmp_path_factory.mktemp(kind)
        overrides = kind_overrides(kind, tmp_path)
        run_dir = tmp_path / "run"
        lines = Lines()
        loggers = [logging.getLogger(name) for name in ("bertkit", "transformers")]
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("WANDB_SILENT", "true")
            patch.delenv("WANDB_MODE", raising=False)
            patch.delenv("WANDB_API_KEY", raising=False)
            patch.setenv("NETRC", str(tmp_path / "no-netrc"))
            # pytest-xdist's workers may ignore SIGINT; a terminal's process does not.
            previous = signal.signal(signal.SIGINT, signal.default_int_handler)
            try:
                with pytest.MonkeyPatch.context() as interrupting:
                    ctrl_c_at(interrupting, INTERRUPT_AT)
                    try:
                        run_job(compose_config(overrides), run_dir=run_dir)
                        stopped = None  # Ctrl-C did not stop it
                    except Preempted as err:
                        stopped = err
                    except KeyboardInterrupt:  # stopped mid-step, without a checkpoint
                        stopped = None
                after = {path.name for path in (run_dir / "checkpoints").glob("*")}
                level = loggers[0].level
                loggers[0].setLevel(logging.INFO)  # bertkit's lines, as the command logs them
                for logger in loggers:
                    logger.addHandler(lines)
                try:
                    run_job(compose_config([*overrides, "resume=auto"]), run_dir=run_dir)
                finally:
                    loggers[0].setLevel(level)
                    for logger in loggers:
                        logger.removeHandler(lines)
            finally:
                signal.signal(signal.SIGINT, previous)
        runs[kind] = InterruptedRun(run_dir, stopped, after, lines.lines)
        return runs[kind]

    return make


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_ctrl_c_saves_a_checkpoint_at_the_step_end_and_stops_as_interrupted(
        kind, interrupted_runs):
    run = interrupted_runs(kind)
    assert run.interrupted is not None, "Ctrl-C did not stop the run with a checkpoint"
    assert run.interrupted.signum == signal.SIGINT
    assert run.interrupted.exit_status == 130  # a shell's status for Ctrl-C; no failed.json
    assert run.interrupted.step == INTERRUPT_AT
    assert run.after_interrupt == {f"checkpoint-{INTERRUPT_AT}"}
    assert str(run.interrupted).startswith(
        f"interrupted (Ctrl-C) at step {INTERRUPT_AT}: checkpoint saved in "
        f"{run.run_dir / 'checkpoints' / f'checkpoint-{INTERRUPT_AT}'}")
    assert not (run.run_dir / "failed.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_a_resumed_run_says_where_it_resumed_from_and_no_tied_weight_is_missing(
        kind, interrupted_runs):
    run = interrupted_runs(kind)
    checkpoint = run.run_dir / "checkpoints" / f"checkpoint-{INTERRUPT_AT}"
    resumed = [line for line in run.resumed_lines if line.startswith("resumed from")]
    assert resumed == [f"resumed from {checkpoint}: step {INTERRUPT_AT} of {STEPS}"]
    assert not [line for line in run.resumed_lines if "missing keys" in line]


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_a_resumed_run_continues_its_wandb_run(kind, interrupted_runs):
    run = interrupted_runs(kind)
    offline = sorted((run.run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 2  # the interrupted session and the resumed one
    ids = {folder.name.rsplit("-", 1)[1] for folder in offline}
    assert len(ids) == 1, offline
    names = {read_offline_run(folder)["name"] for folder in offline}
    assert len(names) == 1, names


@pytest.mark.slow
def test_the_documented_command_reads_each_session_of_the_offline_wandb_run(interrupted_runs,
                                                                          capsys):
    run = interrupted_runs("glue")
    capsys.readouterr()  # the runs' own output
    assert wandb_log.main([str(run.run_dir)]) == 0
    sessions = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [session["exit_code"] for session in sessions] == [130, 0]  # interrupted, finished
    assert len({session["name"] for session in sessions}) == 1
    assert sessions[1]["summary"]["main_metric"] == "accuracy"


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_a_finished_run_keeps_its_model_and_records_and_no_checkpoint(kind, interrupted_runs):
    run = interrupted_runs(kind)
    assert (run.run_dir / "metrics.json").is_file() and (run.run_dir / "config.yaml").is_file()
    assert (run.run_dir / "model" / "config.json").is_file()
    assert (run.run_dir / "model" / "README.md").is_file()
    assert not list(run.run_dir.rglob("checkpoint-*"))


# keep_checkpoints, train_fraction, smoke and the longer schedule (one family: the removal is
# the run lifecycle's, shared by all).

@pytest.mark.slow
def test_keep_checkpoints_keeps_them_and_a_cut_run_keeps_its_own(glue_dir, vocab_dir,
                                                                 tmp_path):
    overrides = tiny_run_overrides("rte", glue_dir("rte"), vocab_dir, **{
        "trainer.max_steps": 4, "trainer.save_strategy": "steps", "trainer.save_steps": 2,
        "cache_dir": tmp_path / "cache"})
    kept = tmp_path / "kept"
    run_job(compose_config([*overrides, "keep_checkpoints=true"]), kept)
    assert scan_checkpoints(kept / "checkpoints").complete == kept / "checkpoints/checkpoint-4"
    # Successive halving's early rung: not finished, continued by resume=true.
    cut = tmp_path / "cut"
    record = run_job(compose_config([*overrides, "train_fraction=0.5"]), cut)
    assert record["train"]["complete"] is False
    assert scan_checkpoints(cut / "checkpoints").complete == cut / "checkpoints/checkpoint-2"
    record = run_job(compose_config([*overrides, "train_fraction=1.0", "resume=true"]), cut)
    assert record["train"]["complete"] is True and record["train"]["steps"] == 4
    assert not list(cut.rglob("checkpoint-*"))  # finished now


def test_a_longer_schedule_on_a_finished_run_without_checkpoints_is_refused_in_one_line(
        tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "model").mkdir(parents=True)
    (run_dir / "metrics.json").write_text("{}")
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(compose_config(
        ["recipe=glue", "task=rte", "trainer.max_steps=4"])))
    cfg = compose_config(["recipe=glue", "task=rte", "resume=true", "trainer.max_steps=8"])
    with pytest.raises(BertkitError) as refused:
        check_finished_run(cfg, run_dir)
    assert str(refused.value) == (
        f"{run_dir} holds a finished run (metrics.json) and no checkpoint to train it on from: "
        f"a finished run keeps its checkpoints only with keep_checkpoints=true; give "
        f"overwrite=true to train it anew with this schedule")
    # Nor does the refusal of a plain rerun suggest the longer schedule.
    with pytest.raises(BertkitError, match="overwrite=true to write over it$") as plain:
        check_finished_run(compose_config(["recipe=glue", "task=rte"]), run_dir)
    assert "longer schedule" not in str(plain.value)
    checkpoint = run_dir / "checkpoints" / "checkpoint-4"
    checkpoint.mkdir(parents=True)  # kept (keep_checkpoints=true): trained on
    assert check_finished_run(cfg, run_dir) is None


# Signals, unit by unit.

def test_a_second_ctrl_c_stops_at_once_and_an_ignored_one_stays_ignored():
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        callback = PreemptionCallback(1)
        assert signal.SIGINT in callback.signals
        callback.on_train_begin(None, None, None)
        os.kill(os.getpid(), signal.SIGINT)  # caught: a checkpoint at the step's end
        assert callback.received == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
        callback.restore_handlers()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a background job of a shell script
        assert signal.SIGINT not in PreemptionCallback(1).signals
    finally:
        signal.signal(signal.SIGINT, previous)


def test_tied_weights_are_not_reported_missing_and_a_real_missing_key_is(caplog):
    from transformers import BertConfig, BertForPreTraining

    model = BertForPreTraining(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                          num_attention_heads=2, intermediate_size=32))
    tied = sorted(model.all_tied_weights_keys)
    assert "cls.predictions.decoder.weight" in tied
    trainer = BertkitTrainer.__new__(BertkitTrainer)
    trainer.model = model
    Keys = namedtuple("Keys", "missing_keys unexpected_keys")
    warnings = []
    handler = Lines()
    logging.getLogger("transformers.trainer").addHandler(handler)
    try:
        trainer._issue_warnings_after_load(Keys(tied, []))
        warnings += handler.lines
        handler.lines.clear()
        trainer._issue_warnings_after_load(Keys([*tied, "bert.pooler.dense.weight"], []))
    finally:
        logging.getLogger("transformers.trainer").removeHandler(handler)
    assert warnings == []
    assert handler.lines == ["There were missing keys in the checkpoint model loaded: "
                             "['bert.pooler.dense.weight']."]


# The command, as a user runs it: the lines printed, the exit status, the resume command.

SIGINT_DRIVER = """
import os, signal, sys
# A terminal's Ctrl-C: a test started in the background by a non-interactive shell inherits
# SIGINT ignored (kept across exec and new sessions), which bertkit rightly leaves ignored.
signal.signal(signal.SIGINT, signal.default_int_handler)
from bertkit.training.trainer import BertkitTrainer
at, times = int(sys.argv[1]), int(sys.argv[2])
original, calls = BertkitTrainer.training_step, {"n": 0}
def step(self, *args, **kwargs):
    calls["n"] += 1
    if calls["n"] == at:
        for _ in range(times):
            os.kill(os.getpid(), signal.SIGINT)
    return original(self, *args, **kwargs)
BertkitTrainer.training_step = step
from bertkit.cli import main
sys.argv = ["bertkit", *sys.argv[3:]]
main()
"""


def bertkit(args: list[str], cwd: Path, ctrl_c: tuple[int, int] | None = None):
    """The bertkit command; ctrl_c=(step, times): Ctrl-C that many times as that training
    step starts (the process signals itself: the moment is exact)."""
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    command = [sys.executable, "-m", "bertkit", *args] if ctrl_c is None else \
        [sys.executable, "-c", SIGINT_DRIVER, *map(str, ctrl_c), *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600, start_new_session=True)


@pytest.mark.slow
def test_the_command_tells_ctrl_c_in_one_line_and_its_resume_command_continues(
        glue_dir, vocab_dir, tmp_path):
    run_dir = tmp_path / "run"
    args = [*tiny_run_overrides("rte", glue_dir("rte"), vocab_dir, **{
        "trainer.max_steps": 6, "keep_checkpoints": True, "cache_dir": tmp_path / "cache"}),
        f"hydra.run.dir={run_dir}"]
    once = bertkit(args, tmp_path, ctrl_c=(3, 1))
    assert once.returncode == 130, once.stderr[-3000:]
    assert "Traceback" not in once.stdout + once.stderr
    told = [line for line in once.stderr.splitlines() if line.startswith("bertkit:")]
    checkpoint = run_dir / "checkpoints" / "checkpoint-3"
    assert len(told) == 1 and told[0].startswith(
        f"bertkit: interrupted (Ctrl-C) at step 3: checkpoint saved in {checkpoint}; "
        f"to continue: bertkit "), told
    resume = shlex.split(told[0].split("to continue: ", 1)[1])
    assert resume[-2:] == [f"hydra.run.dir={run_dir}", "resume=auto"]

    resumed = bertkit(resume[1:], tmp_path)  # the printed command, as it is
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert re.findall(r"resumed from .*", resumed.stdout + resumed.stderr) == [
        f"resumed from {checkpoint}: step 3 of 6"]
    assert (run_dir / "metrics.json").is_file()
    assert (run_dir / "checkpoints" / "checkpoint-3").is_dir()  # keep_checkpoints=true

    twice = bertkit([*args[:-1], f"hydra.run.dir={tmp_path / 'twice'}"], tmp_path,
                    ctrl_c=(3, 2))
    assert twice.returncode == 130, twice.stderr[-3000:]
    assert "Traceback" not in twice.stdout + twice.stderr
    assert [line for line in twice.stderr.splitlines() if line.startswith("bertkit:")] == [
        "bertkit: stopped by Ctrl-C; no checkpoint was saved, nothing to continue from"]
