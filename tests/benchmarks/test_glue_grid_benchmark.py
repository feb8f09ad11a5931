"""The bench_grid recipe: the same grid finetuned by several arms from the same weights: the
plain way (run_glue.py's Trainer, one job after another) and bertkit multiruns, one per
launcher (one at a time, gpu_pack, fused), each job's dev metrics side by side; each bertkit
arm is the `bertkit -m` command a user types, with the user's settings and the arm's launcher."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra.core.hydra_config import HydraConfig
from transformers import AutoModel

import benchmarks.glue_grid as glue_grid
from benchmarks.command import compose_config as compose_benchmark
from benchmarks.glue_grid import (
    JOB,
    PLAIN,
    _bertkit_command,
    _launcher_name,
    available_launchers,
    benchmark_glue_grid,
    starting_weights,
)
from bertkit.data.atomic_files import write_json_atomic
from bertkit.errors import BertkitError
from bertkit.jobs import run_job as run_bertkit_job
from bertkit.training.models import load_tokenizer


def compose_config(overrides: list[str], with_hydra: bool = False):
    """The config `python -m benchmarks.glue_grid <overrides>` runs."""
    return compose_benchmark("bench_grid", overrides, with_hydra)


def run_job(cfg, run_dir=None) -> dict:
    """What `python -m benchmarks.glue_grid` runs: bertkit's run_job, the
    benchmark's job."""
    return run_bertkit_job(cfg, run_dir, job=JOB)


def runnable_arms() -> list[str]:
    """The recipe's default arms whose launcher this bertkit has (fused once it is merged)."""
    grid = compose_config(["model.tokenizer=unused"]).bench_grid
    have = available_launchers()
    return [way for way in grid.ways
            if way == PLAIN or _launcher_name(grid.launchers[way]) in have]


def grid_overrides(data_dir, vocab_dir, tmp_path, ways=("plain", "bertkit")) -> list[str]:
    """2 learning rates x 1 seed of a 2-layer BERT, 24 MRPC pairs, dropout off (so that every
    arm trains the very same model: the plain way's only difference left is padding, which the
    attention mask hides)."""
    return [f"task.data_dir={data_dir}", f"model.tokenizer={vocab_dir}",
            "model.config.hidden_size=32", "model.config.intermediate_size=64",
            "model.hidden_dropout_prob=0.0", "model.attention_probs_dropout_prob=0.0",
            "task.max_seq_length=32", "bench_grid.baseline_max_length=48",
            "bench_grid.learning_rates=[1e-3,3e-4]", "bench_grid.seeds=[3]",
            f"bench_grid.ways=[{','.join(ways)}]", "bench_grid.jobs_per_gpu=2",
            "trainer.per_device_train_batch_size=8", "trainer.num_train_epochs=2",
            f"cache_dir={tmp_path / 'cache'}"]


@pytest.fixture
def as_bertkit_job(monkeypatch):
    """Hydra's config of the job, as under `bertkit` (its overrides make the bertkit arms'
    commands)."""
    hydra = HydraConfig.instance()
    monkeypatch.setattr(hydra, "cfg", hydra.cfg)
    return lambda overrides: hydra.set_config(compose_config(overrides, with_hydra=True))


@pytest.mark.slow
def test_every_arm_finetunes_every_job_of_the_grid_alike(glue_dir, vocab_dir, tmp_path,
                                                        as_bertkit_job):
    arms = runnable_arms()
    overrides = grid_overrides(glue_dir("mrpc", n_train=24, n_dev=12), vocab_dir, tmp_path,
                               arms)
    as_bertkit_job(overrides)
    run_dir = tmp_path / "bench"
    run_job(compose_config(overrides), run_dir)

    result = json.loads((run_dir / "grid_bench.json").read_text())
    jobs = ["lr0.001-seed3", "lr0.0003-seed3"]
    assert result["grid"] == {"learning_rates": [1e-3, 3e-4], "seeds": [3], "batch_size": 8,
                              "epochs": 2, "max_steps": -1, "jobs": 2, "ways": arms}
    assert [job["job"] for job in result["jobs"]] == jobs
    assert result["device"] == "cpu" and result["speed_claim"] is False and result["note"]
    assert list(result["ways"]) == arms and result["reference"] == PLAIN
    launchers = compose_config(overrides).bench_grid.launchers
    ways = result["ways"]
    for way in arms:
        figures = ways[way]
        assert set(figures["jobs"]) == set(jobs)
        assert figures["wall_seconds"] > 0 and figures["peak_memory_gb"] > 0
        assert figures["grid_mfu"] is None  # no peak FLOP/s on a CPU
        assert figures["speed_up"] == {
            base: pytest.approx(ways[base]["wall_seconds"] / figures["wall_seconds"])
            for base in ("plain", "bertkit")}
        for job in figures["jobs"].values():
            assert job["steps"] == 6  # 24 pairs / 8 x 2 epochs
            assert set(job["validation"]) >= {"f1", "accuracy"}
            assert job["peak_memory_gb"] > 0 and job["mfu"] is None
            # A fused member records its array's peak memory, not a throughput meter's FLOPs.
            if way == "fused":
                assert job["flops"] is None
            else:
                assert job["flops"] > 0
        if way == PLAIN:
            continue
        # Each bertkit arm: the user's command on the grid, launched by the arm's launcher.
        command = figures["command"]
        assert command[:3] == ["bertkit", "-m", "recipe=glue"]
        assert "trainer.learning_rate=0.001,0.0003" in command and "seed=3" in command
        assert figures["launcher"] == list(launchers[way])
        assert command[-len(figures["launcher"]):] == figures["launcher"]
        assert f"hydra.sweep.dir={run_dir / way}" in command
        # Its figures are its jobs' own metrics.json.
        for job in figures["jobs"].values():
            assert job["run_dir"].startswith(f"{way}/")
            record = json.loads((run_dir / job["run_dir"] / "metrics.json").read_text())
            assert record["hyperparameters"]["learning_rate"] == job["learning_rate"]
            assert next(iter(record["validation"].values()))["f1"] == job["validation"]["f1"]
            assert record["train"]["loss"] == job["training_loss"]
            assert record["train"]["throughput"]["peak_memory_gb"] == job["peak_memory_gb"]
    # Same weights, data order and hyperparameters: each job trains the same model in every
    # arm, and the two learning rates train different ones (the match is no accident of a grid
    # that does nothing).
    for name, job in zip(jobs, result["jobs"], strict=True):
        plain = ways[PLAIN]["jobs"][name]
        assert set(job["validation"]) == set(arms)
        assert set(job["difference"]) == set(arms) - {PLAIN}
        for way in arms:
            figures = ways[way]["jobs"][name]
            assert figures["training_loss"] == pytest.approx(plain["training_loss"], abs=1e-4)
            assert figures["validation"] == pytest.approx(plain["validation"], abs=1e-6)
            assert job["validation"][way] == figures["validation"]
        assert all(difference == pytest.approx(0, abs=1e-6)
                   for difference in job["difference"].values())
    losses = [ways[PLAIN]["jobs"][name]["training_loss"] for name in jobs]
    assert losses[0] != pytest.approx(losses[1], abs=1e-4)


def test_each_bertkit_arm_is_the_users_command_on_the_grid(glue_dir, vocab_dir, tmp_path,
                                                           as_bertkit_job):
    """The user's settings reach every bertkit arm's grid, the bench's own do not; a model from
    scratch becomes one checkpoint every arm starts from; each arm's command differs from the
    others only by its launcher overrides (its bench_grid.launchers entry, nothing more)."""
    data = glue_dir("mrpc")
    overrides = grid_overrides(data, vocab_dir, tmp_path)
    as_bertkit_job(overrides)
    cfg = compose_config(overrides)
    cfg = starting_weights(cfg, tmp_path / "bench", load_tokenizer(cfg.model))
    checkpoint = tmp_path / "bench" / "initial_checkpoint"
    launchers = cfg.bench_grid.launchers
    assert set(launchers) >= {"bertkit", "gpu_pack", "fused"}
    commands = {way: _bertkit_command(cfg.bench_grid, cfg.model, cfg.trainer, cfg.cache_dir,
                                      tmp_path / "sweep", list(launcher))
                for way, launcher in launchers.items()}
    for way, command in commands.items():
        launcher = list(launchers[way])
        assert command[:3] == ["-m", "recipe=glue", "task=mrpc"]
        assert f"task.data_dir={data}" in command and "model.hidden_dropout_prob=0.0" in command
        assert f"model.name_or_path={checkpoint}" in command
        assert f"model.tokenizer={checkpoint}" in command
        assert f"model.tokenizer={vocab_dir}" not in command
        assert not [o for o in command if o.startswith("bench_grid.")]
        assert "sweep=paper_glue" in command
        assert "trainer.per_device_train_batch_size=8" in command
        assert "trainer.num_train_epochs=2" in command
        assert "trainer.learning_rate=0.001,0.0003" in command and "seed=3" in command
        assert command[-len(launcher):] == launcher
        assert command[:-len(launcher)] == commands["bertkit"][:-1]
        assert [o for o in command if o.startswith("hydra/launcher=")] == [launcher[0]]
    assert commands["bertkit"][-1:] == ["hydra/launcher=basic"]
    assert commands["gpu_pack"][-2:] == ["hydra/launcher=gpu_pack",
                                         "hydra.launcher.jobs_per_gpu=2"]
    assert commands["fused"][-1:] == ["hydra/launcher=fused"]
    # The checkpoint is the model from scratch of model.config, seeded.
    weights = AutoModel.from_pretrained(checkpoint)
    assert weights.config.hidden_size == 32 and weights.config.num_hidden_layers == 2
    again = starting_weights(cfg.copy(), tmp_path / "again", load_tokenizer(cfg.model))
    assert again.model.name_or_path == str(checkpoint)  # a checkpoint is kept as it is


def fake_launch(scores: dict[str, float], seconds: dict[str, float]):
    """launch() standing in for `bertkit`: a multirun leaves each job's metrics.json under its
    hydra.sweep.dir (f1 = the arm's score + the learning rate), as any launcher's jobs do, and
    takes the arm's seconds; a single run (the warm-up) leaves nothing."""
    def launch(command, log, job):
        if command[0] != "-m":
            return 0.5
        values = dict(o.split("=", 1) for o in command if "=" in o)
        way = Path(values["hydra.sweep.dir"]).name
        for rate in values["trainer.learning_rate"].split(","):
            for seed in values["seed"].split(","):
                record = {"hyperparameters": {"learning_rate": float(rate)}, "seed": int(seed),
                          "validation": {"validation": {"f1": scores[way] + float(rate),
                                                        "accuracy": 0.5}},
                          "train": {"seconds": 1.0, "loss": 0.6, "steps": 3,
                                    "throughput": {"peak_memory_gb": 0.25, "flops": 1e9}}}
                write_json_atomic(Path(values["hydra.sweep.dir"]) / f"lr{rate}" / f"s{seed}"
                                  / "metrics.json", record)
        return seconds[way]
    return launch


def test_each_arm_is_timed_scored_and_set_against_the_baselines(glue_dir, vocab_dir, tmp_path,
                                                                as_bertkit_job, monkeypatch,
                                                                capsys):
    """The arms as the bench assembles them, whatever launcher ran them (a fused arm before
    hydra/launcher=fused is merged): its jobs read from the metrics.json they left, its
    speed-up over the baselines that ran, its scores against the reference arm's."""
    ways = ["bertkit", "gpu_pack", "fused"]
    scores, seconds = {"bertkit": 0.5, "gpu_pack": 0.5, "fused": 0.75}, {
        "bertkit": 8.0, "gpu_pack": 4.0, "fused": 2.0}
    monkeypatch.setattr(glue_grid, "launch", fake_launch(scores, seconds))
    monkeypatch.setattr(glue_grid, "available_launchers", lambda: ["basic", "gpu_pack", "fused"])
    overrides = grid_overrides(glue_dir("mrpc"), vocab_dir, tmp_path, ways)
    as_bertkit_job(overrides)
    result = benchmark_glue_grid(compose_config(overrides), tmp_path / "bench")

    assert list(result["ways"]) == ways and result["reference"] == "bertkit"
    jobs = ["lr0.001-seed3", "lr0.0003-seed3"]
    for way in ways:
        figures = result["ways"][way]
        assert figures["wall_seconds"] == seconds[way]
        assert figures["speed_up"] == {"bertkit": seconds["bertkit"] / seconds[way]}
        assert list(figures["jobs"]) == sorted(jobs) and figures["peak_memory_gb"] == 0.25
        assert figures["command"][-len(figures["launcher"]):] == figures["launcher"]
    assert result["ways"]["fused"]["launcher"] == ["hydra/launcher=fused"]
    assert [job["job"] for job in result["jobs"]] == jobs
    for job in result["jobs"]:
        assert job["validation"]["fused"]["f1"] == 0.75 + job["learning_rate"]
        assert job["difference"] == {"gpu_pack": 0, "fused": pytest.approx(0.25)}
    written = (tmp_path / "bench" / "grid_bench.json").read_text()
    assert json.loads(written) == json.loads(json.dumps(result))
    # The printed table: a row per arm with its wall time and speed-up over bertkit.
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [row.split(" | ")[2:4] for row in rows[1:4]] == [
        ["8.0 s", "1.00x"], ["4.0 s", "2.00x"], ["2.0 s", "4.00x"]]


def test_an_arm_that_leaves_a_job_twice_or_not_at_all_is_refused(glue_dir, vocab_dir, tmp_path,
                                                                 as_bertkit_job, monkeypatch):
    monkeypatch.setattr(glue_grid, "launch", fake_launch({"bertkit": 0.5}, {"bertkit": 1.0}))
    overrides = grid_overrides(glue_dir("mrpc"), vocab_dir, tmp_path, ["bertkit"])
    as_bertkit_job(overrides)
    cfg = compose_config([*overrides, "bench_grid.learning_rates=[1e-3,3e-4,2e-4]"])
    # The fake leaves the command's jobs; a grid of three learning rates finds two of them.
    command = glue_grid._bertkit_command
    monkeypatch.setattr(glue_grid, "_bertkit_command", lambda grid, *args: [
        o.replace(",0.0002", "") for o in command(grid, *args)])
    with pytest.raises(BertkitError, match="no metrics.json for lr0.0002-seed3"):
        benchmark_glue_grid(cfg, tmp_path / "bench")
    # A job's metrics.json twice (two runs of one grid point) is no grid to time.
    record = tmp_path / "bench" / "bertkit" / "lr0.001" / "s3" / "metrics.json"
    copy = record.parent.parent / "again" / "metrics.json"
    copy.parent.mkdir()
    copy.write_text(record.read_text())
    monkeypatch.setattr(glue_grid, "launch", lambda *args, **kwargs: 1.0)
    with pytest.raises(BertkitError, match="two metrics.json for lr0.001-seed3"):
        benchmark_glue_grid(compose_config(overrides), tmp_path / "bench")


@pytest.mark.parametrize(("override", "key"), [
    ("bench_grid.learning_rates=[2e-5,2e-5]", "bench_grid.learning_rates"),
    ("bench_grid.seeds=[]", "bench_grid.seeds"),
    ("bench_grid.baseline_padding=longer", "bench_grid.baseline_padding"),
    ("bench_grid.baseline_max_length=16", "bench_grid.baseline_max_length"),
    ("bench_grid.ways=[plain,plain]", "bench_grid.ways"),
    ("bench_grid.ways=[plain,packed]", "bench_grid.ways"),
    ("bench_grid.ways=[]", "bench_grid.ways"),
    ("bench_grid.launchers.gpu_pack=['hydra.launcher.jobs_per_gpu=2']",
     "bench_grid.launchers.gpu_pack"),
    # an arm whose launcher this bertkit lacks: refused before any arm runs
    ("bench_grid.launchers.gpu_pack=['hydra/launcher=no_such_launcher']", "bench_grid.ways"),
])
def test_a_grid_it_cannot_run_is_refused_naming_the_setting(glue_dir, vocab_dir, tmp_path,
                                                            override, key):
    cfg = compose_config([*grid_overrides(glue_dir("mrpc"), vocab_dir, tmp_path,
                                          ("plain", "bertkit", "gpu_pack")), override])
    with pytest.raises(BertkitError, match=key):
        benchmark_glue_grid(cfg, tmp_path / "bench")
    assert not (tmp_path / "bench" / "initial_checkpoint").exists()


def test_the_recipe_holds_the_papers_glue_protocol_and_every_arm():
    cfg = compose_config(["model.tokenizer=unused"])
    assert list(cfg.bench_grid.learning_rates) == [5e-5, 4e-5, 3e-5, 2e-5]
    assert list(cfg.bench_grid.seeds) == [1, 2]
    assert cfg.trainer.per_device_train_batch_size == 32 and cfg.trainer.num_train_epochs == 3
    assert cfg.task.name == "mrpc"
    assert list(cfg.bench_grid.ways) == ["plain", "bertkit", "gpu_pack", "fused"]
    assert {way: _launcher_name(launcher) for way, launcher in cfg.bench_grid.launchers.items()
            } == {"bertkit": "basic", "gpu_pack": "gpu_pack", "fused": "fused"}
