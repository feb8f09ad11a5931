"""hydra/launcher=fused: the jobs of a multirun that differ only in what a member of a model
array may vary train as one array, each job still a run of its own (its directory, .hydra/,
config.yaml, metrics.json, model/, card, log), read by bertkit-report as any grid; a member
whose gradients turn non-finite is that job's failure while the others finish; what no array
can train is refused before any job starts; arrays are split to fit the memory given."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from bertkit.config_schema import TrainerSchema
from bertkit.jobs.fused import member_keys, optimizer_arguments
from hydra_plugins.bertkit_fused_launcher.fused_launcher import (
    FusedLauncher,
    group_jobs,
    split_group,
)
from hydra_plugins.bertkit_gpu_pack_launcher.gpu_pack_launcher import MemoryEstimateConf
from tests.conftest import compose_config, tiny_run_overrides
from tests.sweeps.test_successive_halving import run_bertkit_in_process

# A value of each kind of key, different from every preset's.
OTHER_VALUE = {float: 0.123, int: 7, str: "cosine"}


def _changed(cfg, key: str):
    value = OmegaConf.select(cfg, key)
    return OTHER_VALUE[type(value)] if type(value) in OTHER_VALUE else 0.5


def test_the_member_keys_are_what_trainers_optimizer_and_scheduler_read():
    read = optimizer_arguments()
    assert {"learning_rate", "weight_decay", "warmup_steps", "lr_scheduler_type",
            "adam_beta1", "adam_beta2", "adam_epsilon"} <= read
    assert not read & {"per_device_train_batch_size", "num_train_epochs", "max_steps",
                       "gradient_accumulation_steps"}
    schema = {f"trainer.{name}" for name in TrainerSchema.__dataclass_fields__}
    keys = set(member_keys())
    assert keys - {"seed"} <= schema
    assert {"seed", "trainer.seed", "trainer.max_grad_norm"} <= keys


@pytest.mark.parametrize("key", [key for key in member_keys() if key != "trainer.optim"])
def test_jobs_that_differ_in_a_member_key_share_one_array(key):
    base = compose_config(["task=mrpc"])
    other = base.copy()
    OmegaConf.update(other, key, _changed(base, key), force_add=True)
    assert group_jobs([base, other], member_keys()) == [[0, 1]]


@pytest.mark.parametrize("key", ["trainer.per_device_train_batch_size",
                                 "trainer.num_train_epochs", "task.max_seq_length",
                                 "model.hidden_dropout_prob", "trainer.eval_strategy",
                                 "finetuning.freeze_layers"])
def test_jobs_that_differ_in_anything_else_train_apart(key):
    base = compose_config(["task=mrpc"])
    other = base.copy()
    OmegaConf.update(other, key, 3 if key == "finetuning.freeze_layers"
                     else "no" if key == "trainer.eval_strategy" else _changed(base, key))
    assert group_jobs([base, other, base], member_keys()) == [[0, 2], [1]]


def test_a_group_splits_into_even_arrays_of_at_most_the_cap():
    assert split_group(list(range(7)), 3) == [[0, 1, 2], [3, 4, 5], [6]]
    assert split_group(list(range(8)), 3) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert split_group(list(range(4)), 8) == [[0, 1, 2, 3]]


def _launcher(gib: float) -> FusedLauncher:
    return FusedLauncher(None, None, gib, OmegaConf.structured(MemoryEstimateConf))


def test_the_members_that_fit_are_counted_from_gpu_packs_estimate_less_one_process(tmp_path):
    from transformers import BertConfig

    BertConfig().save_pretrained(tmp_path)
    cfg = compose_config(["recipe=glue", "task=mrpc", "model=bert_base_uncased",
                          f"model.name_or_path={tmp_path}"])
    launcher = _launcher(1.0 + 3 * 2.5)
    fits = launcher.members_that_fit(cfg, [("cpu", None)])
    from bertkit.training.throughput import GIB, job_memory

    estimate = job_memory(cfg, launcher.memory, on_gpu=False)
    member = estimate.total_bytes - GIB + estimate.parameters * 4  # its own model too
    assert fits == int(3 * 2.5 * GIB // member) >= 1
    with pytest.raises(Exception, match="hydra/launcher=fused: one member needs .* not one fits"):
        _launcher(1.1).members_that_fit(cfg, [("cpu", None)])


def tiny_grid(data: Path, vocab: Path, sweep_dir: Path) -> list[str]:
    overrides = [o for o in tiny_run_overrides("wnli", data, vocab, **{
        "trainer.max_steps": -1, "trainer.num_train_epochs": 2,
        "trainer.eval_strategy": "epoch"}) if not o.startswith("trainer.learning_rate=")]
    return ["-m", *overrides, "trainer.learning_rate=1e-3,3e-4", "seed=1,2",
            f"hydra.sweep.dir={sweep_dir}", "hydra/launcher=fused"]


@pytest.mark.slow
def test_a_fused_grid_leaves_one_run_per_job_and_a_failed_member_fails_alone(
        glue_dir, vocab_dir, tmp_path, monkeypatch, capsys):
    """4 jobs in one array; the third member's loss is made NaN at the third step: its job's
    failed.json says so, the three others finish, bertkit-report reads them."""
    from bertkit.reporting.collect import collect_runs
    from bertkit.training import model_array

    forward = model_array.ModelArray.forward
    calls = []

    def poisoned(self, **inputs):
        output = forward(self, **inputs)
        if self.training:
            calls.append(1)
            if len(calls) == 3:  # the third member's loss read as NaN (its graph untouched)
                nan = torch.tensor([False, False, True, False])
                output.losses = torch.where(nan, float("nan"), output.losses)
                output.loss = output.losses.sum()
        return output

    monkeypatch.setattr(model_array.ModelArray, "forward", poisoned)
    monkeypatch.chdir(tmp_path)
    sweep_dir = tmp_path / "sweep"
    with pytest.raises(SystemExit) as exit_status:
        run_bertkit_in_process(monkeypatch, *tiny_grid(glue_dir("wnli"), vocab_dir, sweep_dir))
    assert exit_status.value.code == 1
    err = capsys.readouterr().err
    assert "1 job(s) of this sweep failed" in err
    assert "the training loss became non-finite (NaN or infinite) at step 3" in err
    jobs = sorted(path.parent for path in sweep_dir.rglob(".hydra"))
    assert len(jobs) == 4
    finished = [job for job in jobs if (job / "metrics.json").is_file()]
    (failed,) = [job for job in jobs if (job / "failed.json").is_file()]
    assert len(finished) == 3 and failed not in finished
    for job in finished:
        record = json.loads((job / "metrics.json").read_text())
        given = dict(o.split("=", 1) for o in OmegaConf.load(job / ".hydra" / "overrides.yaml"))
        assert record["seed"] == int(given["seed"])
        assert record["hyperparameters"]["learning_rate"] == float(given["trainer.learning_rate"])
        assert record["train"]["steps"] == 6 and record["train"]["complete"]
        assert (job / "model" / "model.safetensors").is_file()
        assert (job / "model" / "README.md").is_file() and (job / "config.yaml").is_file()
    runs, failures = collect_runs(sweep_dir)
    assert len(runs) == 3 and len(failures) == 1


def test_a_method_no_array_trains_is_refused_before_any_job_starts(
        glue_dir, vocab_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as exit_status:
        run_bertkit_in_process(monkeypatch, *tiny_grid(glue_dir("wnli"), vocab_dir,
                                                       tmp_path / "sweep"), "finetuning=lora")
    assert exit_status.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("bertkit: error: finetuning=lora: its lora method does not run in "
                           "a model array")
    assert not list((tmp_path / "sweep").rglob("metrics.json"))


@pytest.mark.slow
def test_each_member_has_its_own_wandb_run_with_its_name_config_and_history(
        glue_dir, vocab_dir, tmp_path, monkeypatch):
    """W&B offline: each member's run is its job's (name, config, history of its own losses
    and evaluations, final scores), opened once the array trained."""
    from tests.wandb_records import read_offline_run

    monkeypatch.chdir(tmp_path)
    sweep_dir = tmp_path / "sweep"
    grid = [o for o in tiny_grid(glue_dir("wnli"), vocab_dir, sweep_dir)
            if o not in ("logger=none", "seed=1,2")]
    run_bertkit_in_process(monkeypatch, *grid, "seed=1", "logger=wandb",
                           wandb_mode="offline")
    jobs = sorted(path.parent for path in sweep_dir.rglob("metrics.json"))
    assert len(jobs) == 2
    names = set()
    for job in jobs:
        record = json.loads((job / "metrics.json").read_text())
        logs = sorted(job.rglob("run-*.wandb"))
        assert len(logs) == 1, f"{job}: {logs}"
        run = read_offline_run(logs[0].parent)
        names.add(run["name"])
        assert run["config"]["bertkit"]["trainer"]["learning_rate"] == \
            record["hyperparameters"]["learning_rate"]
        assert {"train/loss", "train/learning_rate", "eval/validation_accuracy"} <= \
            run["history_keys"]
        assert run["summary"]["main_value"] == record["main_value"]
        assert run["exit_code"] == 0
    assert len(names) == 2


@pytest.mark.slow
@pytest.mark.xfail(reason="passes alone (-n 0); in the fresh-clone CI under xdist the array's "
                          "fresh process failed to unpickle its task (BrokenProcessPool): the "
                          "multi-GPU path is not verified yet", strict=False)
def test_arrays_split_by_members_per_array_go_round_robin_over_the_gpus(
        glue_dir, vocab_dir, tmp_path, monkeypatch):
    """Two GPUs seen (faked: this machine has none): 4 jobs in arrays of 2
    (hydra.launcher.members_per_array=2), each array in a fresh process of its own GPU slot;
    every job finishes with the results of a one-array launch."""
    monkeypatch.setattr(FusedLauncher, "devices",
                        lambda launcher: [("cuda:0", "0"), ("cuda:1", "1")])
    monkeypatch.chdir(tmp_path)
    sweep_dir = tmp_path / "sweep"
    run_bertkit_in_process(monkeypatch, *tiny_grid(glue_dir("wnli"), vocab_dir, sweep_dir),
                           "hydra.launcher.members_per_array=2",
                           "hydra.launcher.device_memory_gib=8")
    records = [json.loads(path.read_text()) for path in sweep_dir.rglob("metrics.json")]
    assert len(records) == 4
    assert {r["details"]["model_array"]["members"] for r in records} == {2}
    # Each job's own log, written in the array's process.
    assert len(list(sweep_dir.rglob("cli.log"))) == 4


def _presets_an_array_refuses() -> list[str]:
    from bertkit.config_paths import config_dir
    from bertkit.finetuning.methods import METHODS
    from bertkit.jobs.fused import PER_MEMBER_METHODS

    refused = []
    for path in sorted((Path(config_dir()) / "finetuning").glob("*.yaml")):
        node = compose_config([f"finetuning={path.stem}"]).finetuning
        if any(entry.on(node) and name not in PER_MEMBER_METHODS
               for name, entry in METHODS.items()):
            refused.append(path.stem)
    return refused


@pytest.mark.parametrize("overrides, key", [
    *[([f"finetuning={name}"], f"finetuning={name}:") for name in _presets_an_array_refuses()],
    (["finetuning=stilts", "finetuning.intermediate.task=mnli"], "finetuning.intermediate.task="),
    (["early_stopping.patience=2", "trainer.load_best_model_at_end=true"],
     "early_stopping.patience=2"),
    (["train_fraction=0.5"], "train_fraction=0.5"),
    (["budget.minutes=5"], "budget.minutes=5"),
    (["resume=auto"], "resume=auto"),
    (["trainer.optim=sgd"], "trainer.optim=sgd"),
    (["recipe=pretrain"], "recipe.job=pretrain"),
])
def test_what_no_array_trains_is_refused_naming_the_key(overrides, key):
    from bertkit.errors import BertkitError
    from bertkit.jobs.fused import check_fusable

    with pytest.raises(BertkitError) as error:
        check_fusable(compose_config(overrides))
    assert str(error.value).startswith(key), str(error.value)
