"""A run on 2 processes (torchrun, gloo on CPUs) equals the same run on one at the same global
batch: every family's and pretraining's per-step training losses and gradient norms, the
evaluation loss and the dev metrics (docs/scale.md, "What a torchrun run is checked against").

The cases come from the family registry (bertkit.tasks.FAMILIES, with each family's tiny data
from tests/family_fixtures.py), plus GLUE regression (a loss of its own, MSE) and pretraining.
Dropout is off, so the two runs compute the same function; what is left is the order of
floating-point sums (gloo's all-reduce of the gradients, a mean over 4 + 4 rows instead of 8).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock

from bertkit.tasks import FAMILIES
from tests.family_fixtures import TINY_DATA, tiny_family_run
from tests.glue_fixtures import WORDS, write_glue_task
from tests.training.run_jobs import ERROR_FILE

STEPS = 4
GLOBAL_BATCH = 8
PROCESSES = 2
RELATIVE = 1e-3  # measured: at most 1.6e-5 (pytest -s prints each case's)
# The training set is one epoch of the steps, the dev set whole evaluation batches on each
# process (accelerate would repeat examples to even out a short last batch).
SIZES = (STEPS * GLOBAL_BATCH, 16, 8)


def _glue_regression(tmp_path: Path) -> list[str]:
    data = write_glue_task("stsb", tmp_path / "stsb", *SIZES, random.Random(0))
    vocab = tmp_path / "vocab"
    vocab.mkdir()
    (vocab / "vocab.txt").write_text("\n".join(
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", '"', ".", "?", *sorted(WORDS)]) + "\n")
    return ["recipe=glue", "task=stsb", f"task.data_dir={data}", "model=scratch_tiny",
            f"model.tokenizer={vocab}", "model.config.hidden_size=32",
            "model.config.intermediate_size=64", f"cache_dir={tmp_path / 'cache'}"]


def _pretraining(tmp_path: Path) -> list[str]:
    """Static masking: a dynamic mask is drawn per process (bertkit.pretraining.masking),
    so two processes mask other positions than one by design."""
    return ["recipe=pretrain", "corpus=demo", "model=scratch_tiny", "masking=static",
            "tokenizer_training.enabled=true", "tokenizer_training.vocab_size=400",
            "pretraining.max_seq_length=64", "pretraining.long_phase.fraction=0.0",
            "model.config.max_position_embeddings=128", "model.config.hidden_size=32",
            "model.config.intermediate_size=64", f"cache_dir={tmp_path / 'cache'}",
            "trainer.warmup_steps=0", "trainer.disable_tqdm=true"]


def _family(family: str):
    return lambda tmp_path: tiny_family_run(family, tmp_path, SIZES)[0]


CASES = {**{family: _family(family) for family in FAMILIES},
         "glue_regression": _glue_regression, "pretraining": _pretraining}


def test_every_family_has_a_case():
    assert set(FAMILIES) <= set(TINY_DATA) and set(FAMILIES) <= set(CASES)


REPOSITORY = Path(__file__).resolve().parents[2]
LAUNCH_SECONDS = 900  # a launch of every case takes about 60 s on 2 CPU cores
# A run on 2 processes resumed from a checkpoint inside a logging window records what the
# uninterrupted 2-process run records (docs/reliability.md, "Resumed runs record what the
# uninterrupted run records"): the main process saves the checkpoint alone, so it must carry
# what the log line reads from every process. Killing the run right after checkpoint-2 leaves
# the same checkpoint as the finished run's checkpoint-2, so the resume starts from a copy.
RESUME_CASES = ("glue", "pretraining")
RESUME_STEPS = {"trainer.max_steps": 6, "trainer.eval_steps": 6,
                "trainer.save_strategy": "steps", "trainer.save_steps": 2,
                "trainer.save_total_limit": 3, "trainer.logging_steps": 3}


def _job(overrides: list[str], run_dir: Path, processes: int, **settings) -> dict:
    """The tiny run of `overrides` on `processes` at the global batch (`settings`: the keys
    that differ from this module's)."""
    common = {"logger": "none", "model.hidden_dropout_prob": 0,
              "model.attention_probs_dropout_prob": 0, "trainer.max_steps": STEPS,
              "trainer.logging_steps": 1, "trainer.learning_rate": 1e-3,
              "trainer.save_strategy": "steps", "trainer.save_steps": STEPS,
              "trainer.per_device_train_batch_size": GLOBAL_BATCH // processes,
              "trainer.per_device_eval_batch_size": 4,
              # the records are read from the checkpoints of the finished runs
              "keep_checkpoints": True}
    if "recipe=pretrain" not in overrides:  # an evaluation loss in the log (pretraining has
        common.update({"trainer.eval_strategy": "steps", "trainer.eval_steps": STEPS})  # its own)
    common.update(settings)
    return {"overrides": [*overrides, *(f"{key}={value}" for key, value in common.items())],
            "run_dir": str(run_dir)}


def _launch(jobs: list[dict], processes: int, root: Path) -> None:
    """Every job in one launch (tests/training/run_jobs.py): a process, or torchrun's."""
    jobs_file = root / f"jobs-{processes}-{len(list(root.glob('jobs-*')))}.json"
    jobs_file.write_text(json.dumps(jobs))
    launcher = [sys.executable] if processes == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={processes}"]
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1",
           "BERTKIT_CACHE": str(root / "bertkit-cache")}
    # A session of its own: on a timeout the whole launch is stopped, torchrun's workers too.
    launch = subprocess.Popen([*launcher, "-m", "tests.training.run_jobs", str(jobs_file)],
                              cwd=REPOSITORY, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = launch.communicate(timeout=LAUNCH_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(launch.pid, signal.SIGKILL)
        output, _ = launch.communicate()
        raise AssertionError(f"the launch ran past {LAUNCH_SECONDS} s: {output[-3000:]}") from None
    assert launch.returncode == 0, output[-6000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Every case on one process and on two, and the 2-process resumes: three launches in all,
    read by every test of this module, once per pytest session: under pytest-xdist the
    workers share them through the session's common temporary directory, the first one to
    take the lock running them. root/<case>/processes-<n>/, root/resume-<case>/."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    root = shared / "process-equivalence"
    with FileLock(str(root) + ".lock"):
        if (root / "failed").is_file():  # the other worker's launches failed: not again
            raise AssertionError((root / "failed").read_text())
        if not (root / "done").is_file():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir()
            try:
                _run_every_case(root)
            except BaseException as err:
                (root / "failed").write_text(str(err))
                raise
            (root / "done").touch()
    return root


def _run_every_case(root: Path) -> None:
    launches: dict[int, list[dict]] = {1: [], PROCESSES: []}
    overrides = {}
    for case, make in CASES.items():
        (root / case).mkdir()
        overrides[case] = make(root / case)
        for processes in launches:
            launches[processes].append(_job(overrides[case], root / case /
                                            f"processes-{processes}", processes))
    for case in RESUME_CASES:
        launches[PROCESSES].append(_job(overrides[case], root / f"resume-{case}" / "reference",
                                        PROCESSES, **RESUME_STEPS))
    for processes, jobs in launches.items():
        _launch(jobs, processes, root)
    resumes = []
    for case in RESUME_CASES:
        reference, resumed = (root / f"resume-{case}" / name for name in ("reference",
                                                                         "resumed"))
        if (reference / "checkpoints" / "checkpoint-2").is_dir():
            shutil.copytree(reference / "checkpoints" / "checkpoint-2",
                            resumed / "checkpoints" / "checkpoint-2")
        resumes.append(_job(overrides[case], resumed, PROCESSES, resume="true",
                            **RESUME_STEPS))
    _launch(resumes, PROCESSES, root)


def _finished(run_dir: Path) -> Path:
    error = run_dir / ERROR_FILE
    assert not error.exists(), error.read_text()[-3000:]
    return run_dir


def _record(run_dir: Path) -> dict:
    """Per step: the training loss and gradient norm; the evaluation losses; the dev scores."""
    state = json.loads((run_dir / "checkpoints" / f"checkpoint-{STEPS}"
                        / "trainer_state.json").read_text())
    steps = {entry["step"]: (entry["loss"], entry["grad_norm"])
             for entry in state["log_history"] if "loss" in entry}
    evaluation = {key: value for entry in state["log_history"] for key, value in entry.items()
                  if key.startswith("eval_") and key.endswith("_loss")}
    metrics = json.loads((run_dir / "metrics.json").read_text())
    if "heldout" in metrics:  # pretraining: the held-out scores of the final model
        final = metrics["heldout"]["final"]
        validation = {"heldout": {key: value for key, value in final.items()
                                  if key != "elapsed_seconds"}}
    else:
        validation = metrics["validation"]
    return {"steps": steps, "evaluation": evaluation, "train_loss": metrics["train"]["loss"],
            "validation": validation}


_differences: list[float] = []  # this test's relative differences, for its printout


def _close(one: float, two: float) -> bool:
    difference = abs(one - two) / max(abs(one), 1e-8)
    _differences.append(difference)
    return difference <= RELATIVE


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("case", sorted(CASES))
def test_two_processes_equal_one(case, runs):
    one, two = (_record(_finished(runs / case / f"processes-{processes}"))
                for processes in (1, PROCESSES))
    _differences.clear()
    shown = json.dumps({"one": one, "two": two}, indent=1, default=str)

    assert sorted(one["steps"]) == sorted(two["steps"]) == list(range(1, STEPS + 1)), shown
    for step, (loss, norm) in one["steps"].items():
        other_loss, other_norm = two["steps"][step]
        assert _close(loss, other_loss) and _close(norm, other_norm), f"step {step}: {shown}"
    assert _close(one["train_loss"], two["train_loss"]), shown
    assert one["evaluation"].keys() == two["evaluation"].keys(), shown
    if case not in ("pretraining", "squad"):  # SQuAD's dev features carry no answer
        assert one["evaluation"], shown
    for key, value in one["evaluation"].items():
        assert _close(value, two["evaluation"][key]), f"{key}: {shown}"
    assert one["validation"].keys() == two["validation"].keys(), shown
    for split, scores in one["validation"].items():
        for metric, value in scores.items():
            if isinstance(value, (int, float)):
                assert _close(value, two["validation"][split][metric]), \
                    f"{split} {metric}: {shown}"
    # The figures of docs/scale.md (pytest -s shows them).
    print(f"{case}: {len(_differences)} values, largest relative difference "
          f"{max(_differences):.1e}")


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("case", RESUME_CASES)
def test_two_processes_resumed_inside_a_logging_window_record_the_uninterrupted_run(
        case, runs):
    from tests.training.test_resume import leaves, untimed

    reference, resumed = (_finished(runs / f"resume-{case}" / name)
                          for name in ("reference", "resumed"))
    assert (resumed / "checkpoints" / "checkpoint-6").is_dir()

    def record(run_dir: Path) -> dict:
        metrics = json.loads((run_dir / "metrics.json").read_text())
        return {key: value.replace(str(run_dir), "<run>") if isinstance(value, str) else value
                for key, value in leaves(untimed(metrics)).items()}

    expected, found = record(reference), record(resumed)
    differing = {key: (expected.get(key), found.get(key)) for key in expected.keys() | found
                 if expected.get(key) != found.get(key)}
    assert differing == {}
