"""Shared fixtures: Hydra composition of the real config tree, a tiny WordPiece vocabulary,
and GLUE task files written in each task's original layout."""

from __future__ import annotations

import functools
import os
import random
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from bertkit.cli import register_resolvers
from bertkit.config_paths import recipes_dir
from bertkit.config_tree import config_dir
from tests.glue_fixtures import WORDS, write_glue_task

pytest_plugins = ["tests.runs"]  # the session-shared runs' fixtures

GLUE_TASKS = ["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"]
# The calibrated protocols: the experiment presets recipes/experiment/minilm_<task>.yaml.
PROTOCOLS = sorted(path.stem for path in (Path(recipes_dir()) / "experiment").glob("minilm_*.yaml"))


def pytest_configure(config):
    """Under pytest-xdist (make test, make test-all: TEST_WORKERS processes), each worker takes
    an equal share of torch's threads, for itself and (OMP_NUM_THREADS) for the processes its
    tests start: two workers each with every core would oversubscribe them. A thread count
    set by the user is kept."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not workers or "OMP_NUM_THREADS" in os.environ:
        return
    import torch

    threads = max(1, torch.get_num_threads() // int(workers))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


@pytest.hookimpl(tryfirst=True)  # before -m "not slow" deselects
def pytest_collection_modifyitems(items):
    """A test of the benchmark files or of the pretrained checkpoint is slow as well: make test
    is the everyday run, on a fresh clone without either (make test-all and .ci/run have them)."""
    for item in items:
        if item.get_closest_marker("real_data") or item.get_closest_marker("real_model"):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Tokenised data and demo files go to a per-session temp dir, never to ~/.cache."""
    cache = tmp_path_factory.getbasetemp() / "bertkit-cache"
    monkeypatch.setenv("BERTKIT_CACHE", str(cache))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(cache / "no-netrc"))
    fresh_hub_decision(monkeypatch)


def fresh_hub_decision(monkeypatch) -> None:
    """Each test decides anew whether the Hub can be reached (bertkit.data.task_data decides once
    per process), and what a job's offline mode sets is undone after it."""
    import datasets.config
    import huggingface_hub.constants

    from bertkit.data import task_data as hub

    monkeypatch.setattr(hub, "_settings", {})
    monkeypatch.setattr(hub, "_reachable", {})
    for name in hub.OFFLINE_VARIABLES:  # recorded, so that a value go_offline sets is undone
        if name in os.environ:
            monkeypatch.setenv(name, os.environ[name])
        else:
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE",
                        huggingface_hub.constants.HF_HUB_OFFLINE)
    for flag in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setattr(datasets.config, flag, getattr(datasets.config, flag))


@pytest.fixture
def hub_offline(monkeypatch):
    """Hub offline mode as a user without network gets it. The environment variables alone
    come too late in a test (datasets and huggingface_hub read them at import), and without
    the flags each Hub call retries DNS for about 20 s before it fails."""
    from tests.runs import offline  # after pytest registers the plugin (assert rewriting)

    offline(monkeypatch)


@functools.cache
def glue_classification_tasks() -> tuple[str, ...]:
    """Every task conf of the GLUE family that has classes (not regression), read from
    conf/task/ rather than listed, so that a task added there is tested too."""
    tasks = []
    for path in sorted((Path(config_dir()) / "task").glob("*.yaml")):
        task = compose_config([f"task={path.stem}"]).task
        if task.family == "glue" and task.labels is not None:
            tasks.append(path.stem)
    return tuple(tasks)


def compose_config(overrides: list[str], with_hydra: bool = False) -> DictConfig:
    register_resolvers()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return compose(config_name="config", overrides=overrides,
                       return_hydra_config=with_hydra)


def refusal(overrides: list[str], check) -> str:
    """The one line that refuses `bertkit <overrides>`: a wrong type as Hydra composes (as the
    command prints it), else what `check(cfg)` raises (a range, a rule between settings)."""
    from hydra.errors import ConfigCompositionException

    from bertkit.cli import composition_message
    from bertkit.errors import BertkitError

    try:
        cfg = compose_config(overrides)
    except ConfigCompositionException as err:
        message = composition_message(err)
        assert message is not None, f"{overrides}: Hydra's own message {err}"
        return message
    with pytest.raises(BertkitError) as error:
        check(cfg)
    return str(error.value)


@pytest.fixture
def vocab_dir(tmp_path) -> Path:
    """A whole-word WordPiece vocabulary covering every word the GLUE fixtures write."""
    return write_vocab(tmp_path / "vocab")


def write_vocab(directory: Path) -> Path:
    """vocab_dir's vocabulary, written into directory."""
    directory.mkdir(parents=True)
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", '"', ".", "?"] + sorted(WORDS)
    (directory / "vocab.txt").write_text("\n".join(tokens) + "\n")
    return directory


@pytest.fixture
def glue_dir(tmp_path):
    """A function task -> directory holding that task's files in the original GLUE layout."""

    def make(task: str, n_train: int = 24, n_dev: int = 12, n_test: int = 6) -> Path:
        directory = tmp_path / "glue" / task
        write_glue_task(task, directory, n_train, n_dev, n_test, random.Random(0))
        return directory

    return make


def tiny_run_overrides(task: str, data_dir: Path, vocab: Path, **extra) -> list[str]:
    """A random-init 2-layer BERT for a handful of steps, no W&B."""
    overrides = {
        "recipe": "glue",
        "task": task,
        "task.data_dir": str(data_dir),
        "model": "scratch_tiny",
        "model.tokenizer": str(vocab),
        "model.config.hidden_size": 32,
        "model.config.intermediate_size": 64,
        "logger": "none",
        "trainer.max_steps": 4,
        "trainer.per_device_train_batch_size": 8,
        "trainer.per_device_eval_batch_size": 8,
        "trainer.logging_steps": 1,
        "trainer.eval_strategy": "no",
        "trainer.save_strategy": "no",
        "trainer.disable_tqdm": True,
        "trainer.learning_rate": 1e-3,
        **extra,
    }
    return [f"{key}={value}" for key, value in overrides.items()]


def tiny_checkpointed_training(vocab: Path, cache_dir: Path) -> dict:
    """A random-init 2-layer BERT for 6 steps, evaluated and checkpointed every 2 (for tests of
    checkpoint selection and resuming: the finished run keeps its checkpoints), no W&B,
    tokenisation cached under cache_dir."""
    return {
        "keep_checkpoints": True,
        "model": "scratch_tiny",
        "model.tokenizer": str(vocab),
        "model.config.hidden_size": 32,
        "model.config.intermediate_size": 64,
        "logger": "none",
        "cache_dir": str(cache_dir),
        "trainer.max_steps": 6,
        "trainer.per_device_train_batch_size": 8,
        "trainer.per_device_eval_batch_size": 8,
        "trainer.learning_rate": 5e-3,
        "trainer.warmup_steps": 0,
        "trainer.eval_strategy": "steps",
        "trainer.eval_steps": 2,
        "trainer.save_strategy": "steps",
        "trainer.save_steps": 2,
        "trainer.logging_steps": 1,
        "trainer.disable_tqdm": True,
    }


def real_data_dir() -> Path:
    path = os.environ.get("BERTKIT_DATA")
    if not path:
        pytest.skip("BERTKIT_DATA is not set (the benchmark files, e.g. ../shared/data)")
    return Path(path)
