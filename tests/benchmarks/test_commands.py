"""Each benchmark is a command beside bertkit, `python -m benchmarks.<module>`: its job, its
primary config in benchmarks/conf/ (bertkit's config with the benchmark's recipe), composed
with bertkit's groups and checked against bertkit's schema and the benchmarks' own."""

from __future__ import annotations

import importlib
import os
import pkgutil
import subprocess
import sys
from pathlib import Path
from pkgutil import resolve_name as imported

import pytest
from omegaconf import OmegaConf

import benchmarks
from benchmarks.command import CONF_DIR, compose_config
from benchmarks.settings import check_settings
from bertkit.config_paths import recipes_dir
from bertkit.config_schema import check_ranges
from bertkit.errors import BertkitError
from bertkit.jobs import run_job
from tests.conftest import PROTOCOLS
from tests.doc_commands import REPO

# module -> its primary config: every module of benchmarks/ that is a command (has a JOB).
COMMANDS = {info.name: module.CONFIG for info in pkgutil.iter_modules(benchmarks.__path__)
            if hasattr(module := importlib.import_module(f"benchmarks.{info.name}"), "JOB")}


def test_every_benchmark_config_has_its_command():
    assert sorted(COMMANDS.values()) == sorted(path.stem for path in CONF_DIR.glob("*.yaml"))
    assert len(COMMANDS) == 9


@pytest.mark.parametrize("module", sorted(COMMANDS))
def test_a_benchmarks_job_names_its_function_and_the_file_it_writes(module):
    loaded = importlib.import_module(f"benchmarks.{module}")
    assert loaded.JOB.result_file == loaded.RESULT_FILE
    assert loaded.JOB.entry.split(":")[0] == loaded.__name__
    assert callable(imported(loaded.JOB.entry))


@pytest.mark.parametrize("selection", [[config] for config in sorted(COMMANDS.values())]
                         + [["bench_parity", f"experiment={name}"] for name in PROTOCOLS])
def test_every_benchmark_composes_against_the_schemas(selection):
    """A benchmark's YAML cannot add a trainer key the schema lacks (bench_glue's
    logging_strategy did): each composes, within bertkit's bounds and the benchmarks'."""
    cfg = compose_config(selection[0], selection[1:])
    assert cfg.recipe.name == selection[0]
    assert cfg.trainer.learning_rate > 0
    check_ranges(cfg)
    check_settings(cfg)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_protocol_sets_its_task_and_wins_over_the_parity_recipe(protocol):
    written = OmegaConf.load(Path(recipes_dir()) / "experiment" / f"{protocol}.yaml").trainer
    cfg = compose_config("bench_parity", [f"experiment={protocol}"])
    assert cfg.task.name == protocol.removeprefix("minilm_")
    assert cfg.model.name_or_path.endswith("all-MiniLM-L6-v2")
    assert cfg.recipe.name == "bench_parity" and cfg.recipe.job == "bench_parity"
    for key, value in written.items():
        assert cfg.trainer[key] == value, key
    assert compose_config("bench_parity", [f"experiment={protocol}", "trainer.learning_rate=3e-5"]
                          ).trainer.learning_rate == 3e-5


@pytest.mark.parametrize("overrides, key, length", [
    # bench_step's workloads: was "bench.glue: expected 3 <= min_length (8) < seq_length ..."
    (["bench.glue.seq_length=1024"], "bench.glue.seq_length", 1024),
    (["bench.pretraining.seq_length=600"], "bench.pretraining.seq_length", 600),
])
def test_a_length_beyond_the_model_positions_names_the_key_the_user_set(overrides, key, length,
                                                                         tmp_path):
    from benchmarks.step_cost import JOB
    cfg = compose_config("bench_step", [*overrides, f"cache_dir={tmp_path / 'cache'}"])
    with pytest.raises(BertkitError) as error:
        run_job(cfg, tmp_path / "run", job=JOB)
    message = str(error.value)
    assert message.startswith(f"{key}={length} exceeds the 512 positions of "
                              f"bench.model.max_position_embeddings: "), message
    assert f"lower {key} to at most 512" in message and "\n" not in message
    assert not (tmp_path / "cache").exists()


def test_bench_step_names_the_shorter_key_of_a_contradiction(tmp_path):
    from benchmarks.step_cost import JOB
    cfg = compose_config("bench_step", ["bench.glue.min_length=200"])
    with pytest.raises(BertkitError, match=r"^bench\.glue\.min_length=200: expected less than "
                                           r"bench\.glue\.seq_length=128$"):
        run_job(cfg, tmp_path / "run", job=JOB)


def run_command(module: str, *overrides: str) -> subprocess.CompletedProcess:
    """The command as the Makefile runs it, from the repository's root."""
    return subprocess.run([sys.executable, "-m", f"benchmarks.{module}", *overrides], cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_the_command_says_bertkits_one_line_and_refuses_a_finished_run(tmp_path):
    refused = run_command("glue_padding", "bench.steps=0", f"hydra.run.dir={tmp_path / 'a'}")
    assert (refused.returncode, refused.stderr.strip()) == (
        2, "bertkit: error: bench.steps=0: expected a number >= 1")
    finished = tmp_path / "b"
    finished.mkdir()
    (finished / "bench.json").write_text("{}")
    refused = run_command("glue_padding", f"hydra.run.dir={finished}")
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        f"bertkit: error: {finished} holds a finished run (bench.json): give "
        f"hydra.run.dir=<another directory>, or overwrite=true to write over it")
    assert sorted(path.name for path in finished.iterdir()) == ["bench.json"]
