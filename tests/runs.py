"""Tiny end-to-end runs built once per pytest session and read by every test that checks their
outputs, so that no test re-runs what another already ran. Under pytest-xdist the workers
share a run through the session's common temporary directory: the first worker to take its
lock builds it, the others wait and read it (a failed build is reported to each, not redone)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock

RECORD = "record.json"  # what run_job returned, beside the run's own files


def session_root(tmp_path_factory) -> Path:
    """The temporary directory every worker of this pytest session sees."""
    root = tmp_path_factory.getbasetemp()
    return root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root


def isolate(patch: pytest.MonkeyPatch, cache: Path) -> None:
    """What tests.conftest's autouse fixture sets for a test, for a run built outside one
    (session fixtures are made before a test's own fixtures): the cache under cache, W&B
    silent and without credentials, the Hub decided anew."""
    from tests.conftest import fresh_hub_decision

    patch.setenv("BERTKIT_CACHE", str(cache))
    patch.setenv("WANDB_SILENT", "true")
    patch.delenv("WANDB_MODE", raising=False)
    patch.delenv("WANDB_API_KEY", raising=False)
    patch.setenv("NETRC", str(cache / "no-netrc"))
    fresh_hub_decision(patch)


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """root/runs/name, made by build(root/runs/name) once in the session, whichever worker asks
    first."""
    root = session_root(tmp_path_factory)
    directory = root / "runs" / name
    directory.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(directory) + ".lock"):
        failed, done = Path(f"{directory}.failed"), Path(f"{directory}.done")
        if failed.is_file():
            raise AssertionError(f"shared run {name} failed: {failed.read_text()}")
        if not done.is_file():
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()
            try:
                with pytest.MonkeyPatch.context() as patch:
                    isolate(patch, Path(f"{directory}.cache"))  # its own: builds may overlap
                    build(directory)
            except BaseException as err:
                failed.write_text(f"{type(err).__name__}: {err}")
                raise
            done.touch()
    return directory


def job_run(tmp_path_factory, name: str, overrides: Callable[[Path], list[str]],
            hub_offline: bool = False) -> tuple[Path, dict]:
    """A run of bertkit.jobs.run_job with overrides(directory) into directory/run, built once:
    its run directory and the record run_job returned."""
    from bertkit.jobs import run_job
    from tests.conftest import compose_config

    def build(directory: Path) -> None:
        with pytest.MonkeyPatch.context() as patch:
            if hub_offline:
                offline(patch)
            record = run_job(compose_config(overrides(directory)), directory / "run")
        (directory / RECORD).write_text(json.dumps(record, default=str))

    directory = built_once(tmp_path_factory, name, build)
    return directory / "run", json.loads((directory / RECORD).read_text())


def offline(patch: pytest.MonkeyPatch) -> None:
    """tests.conftest's hub_offline, for a run built outside a test."""
    import datasets
    import huggingface_hub.constants

    patch.setenv("HF_DATASETS_OFFLINE", "1")
    patch.setenv("HF_HUB_OFFLINE", "1")
    patch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    patch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    patch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


GLUE_SIZES = (24, 12, 6)  # training, each dev and each test split of a shared GLUE run
GLUE_STEPS = 4


@pytest.fixture(scope="session")
def glue_task_run(tmp_path_factory) -> Callable[[str], tuple[Path, dict, Path]]:
    """task -> (run directory, run_job's record, data directory) of a tiny finetune of that
    GLUE task (tests.conftest.tiny_run_overrides, GLUE_STEPS steps, the Hub offline) on
    GLUE_SIZES examples: the task's files in the original GLUE layout, or for a task that
    generates its own set (demo) that set."""
    import random

    from omegaconf import OmegaConf

    from tests.conftest import compose_config, tiny_run_overrides, write_vocab
    from tests.glue_fixtures import LABELS, write_glue_task

    n_train, n_dev, n_test = GLUE_SIZES

    def overrides(task: str, directory: Path) -> list[str]:
        data = directory / "data"
        if OmegaConf.select(compose_config([f"task={task}"]).task, "synthetic") is not None:
            return tiny_run_overrides(task, data, data, **{
                "task.synthetic.num_train": n_train, "task.synthetic.num_validation": n_dev,
                "task.synthetic.num_test": n_test, "trainer.max_steps": GLUE_STEPS})
        if task not in LABELS:
            pytest.fail(f"task {task}: no file layout for it in tests/glue_fixtures.py")
        write_glue_task(task, data, n_train, n_dev, n_test, random.Random(0))
        return tiny_run_overrides(task, data, write_vocab(directory / "vocab"),
                                  **{"trainer.max_steps": GLUE_STEPS})

    def make(task: str) -> tuple[Path, dict, Path]:
        run_dir, record = job_run(tmp_path_factory, f"glue-{task}",
                                  lambda directory: overrides(task, directory), hub_offline=True)
        return run_dir, record, run_dir.parent / "data"

    return make


@pytest.fixture(scope="session")
def swag_run(tmp_path_factory) -> tuple[Path, dict, Path]:
    """The SWAG family's tiny run (tests.tasks.swag.test_swag_recipe.swag_overrides: 6 steps,
    evaluated every 3), W&B offline, seed 5: (run directory, run_job's record, dev file)."""
    from tests.tasks.swag.test_swag_recipe import swag_overrides, write_swag_files

    run_dir, record = job_run(tmp_path_factory, "swag", lambda directory: swag_overrides(
        *write_swag_files(directory), directory, logger="wandb", seed=5))
    return run_dir, record, run_dir.parent / "data" / "val.csv"


@pytest.fixture(scope="session")
def ner_run(tmp_path_factory) -> tuple[Path, dict, dict]:
    """The NER family's tiny run (tests.tasks.ner.test_ner_recipe.ner_overrides, 40 steps,
    evaluated and checkpointed every 20), W&B offline: (run directory, run_job's record,
    split -> (its file, its sentences))."""
    from tests.ner_fixtures import make_sentences, write_vocab
    from tests.tasks.ner.test_ner_recipe import SEEDS, ner_overrides, write_conll_files

    sizes = {"train": 48, "validation": 16, "test": 12}

    def overrides(directory: Path) -> list[str]:
        files = write_conll_files(directory, *sizes.values())
        return ner_overrides(files, write_vocab(directory / "vocab"), directory,
                             logger="wandb", **{"trainer.max_steps": 40,
                                                "trainer.eval_steps": 20,
                                                "trainer.save_steps": 20})

    run_dir, record = job_run(tmp_path_factory, "ner", overrides)
    return run_dir, record, {
        split: (run_dir.parent / "conll" / f"{split}.txt", make_sentences(n, SEEDS[split]))
        for split, n in sizes.items()}


@pytest.fixture(scope="session")
def pretraining_run(tmp_path_factory) -> tuple[Path, dict]:
    """The pretraining recipe's tiny run (tests.pretraining.test_pretrain_recipe.small_run: a
    32-wide BERT, 8 steps on the demo corpus, MLM + NSP), W&B offline, seed 5: (run
    directory, the summary pretrain returned)."""
    from bertkit.pretraining.run import pretrain
    from tests.conftest import compose_config
    from tests.pretraining.test_pretrain_recipe import small_run

    def build(directory: Path) -> None:
        summary = pretrain(compose_config(small_run(logger="wandb", seed=5)), directory / "run")
        (directory / RECORD).write_text(json.dumps(summary, default=str))

    directory = built_once(tmp_path_factory, "pretraining", build)
    return directory / "run", json.loads((directory / RECORD).read_text())


@pytest.fixture(scope="session")
def halving_sweep(tmp_path_factory) -> Path:
    """sweep=paper_grid_halving through the `bertkit` command and the sequential launcher
    (tests.sweeps.test_launchers.grid_overrides: a 2 x 2 grid x 2 seeds of WNLI, 64 training
    examples, W&B offline): the directory holding its data (glue/wnli, vocab) and its sweep
    (sequential/)."""
    import random

    from tests.conftest import write_vocab
    from tests.glue_fixtures import write_glue_task
    from tests.sweeps.test_launchers import grid_overrides, run_bertkit

    def build(directory: Path) -> None:
        data = directory / "glue" / "wnli"
        write_glue_task("wnli", data, 64, 12, 6, random.Random(0))  # glue_dir's, 64 to train
        run_bertkit(directory, "-m", "sweep=paper_grid_halving", *grid_overrides(
            data, write_vocab(directory / "vocab"), directory / "sequential",
            directory / "cache"))

    return built_once(tmp_path_factory, "halving-sweep", build)
