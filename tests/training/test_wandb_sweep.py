"""A multirun job's W&B sweep id, group and name, resolved from the config as a job of a
launch sees it (Hydra's config of the job, the launch's multirun.yaml), without running it."""

from __future__ import annotations

import pytest
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from bertkit.data.job_overrides import short_key
from bertkit.training.wandb_logging import MAX_NAME_LENGTH, fit
from tests.conftest import compose_config

# As `bertkit -m recipe=glue task=mrpc sweep=paper_grid trainer.learning_rate=2e-5,3e-5
# trainer.num_train_epochs=3 seed=1,2` records it: the preset's epochs narrowed to one.
COMMAND_LINE = ["recipe=glue", "task=mrpc", "sweep=paper_grid",
                "trainer.learning_rate=2e-5,3e-5", "trainer.num_train_epochs=3", "seed=1,2"]


@pytest.fixture
def job_of_a_launch(tmp_path):
    """The W&B settings of one job of that launch, resolved as the job resolves them."""
    sweep_dir = tmp_path / "2026-01-01_00-00-00"
    sweep_dir.mkdir()
    OmegaConf.save({"hydra": {"overrides": {"task": COMMAND_LINE}}},
                   sweep_dir / "multirun.yaml")

    def job(*overrides: str):
        task = ["recipe=glue", "task=mrpc", "sweep=paper_grid", *overrides,
                "trainer.num_train_epochs=3"]
        cfg = compose_config([*task, "hydra.mode=MULTIRUN", f"hydra.sweep.dir={sweep_dir}"],
                             with_hydra=True)
        cfg.hydra.overrides.task = task
        cfg.hydra.runtime.cwd = str(tmp_path)
        HydraConfig.instance().set_config(cfg)
        return OmegaConf.to_container(cfg.logger, resolve=True)

    yield job
    HydraConfig.instance().cfg = None


def test_a_jobs_group_is_its_configuration_and_its_name_adds_the_seed(job_of_a_launch):
    logger = job_of_a_launch("trainer.per_device_train_batch_size=16",
                             "trainer.learning_rate=2e-05", "seed=1")
    assert logger["sweep_id"] == "paper_grid-2026-01-01_00-00-00"
    # Swept: the preset's batch sizes and the command line's rates and seeds; the epochs were
    # narrowed to one value, the task never swept.
    assert logger["group"] == ("paper_grid-2026-01-01_00-00-00 per_device_train_batch_size:16 "
                            "learning_rate:2e-05")
    assert logger["name"] == "mrpc per_device_train_batch_size:16 learning_rate:2e-05 seed:1"
    assert logger["tags"] == ["recipe:glue", "task:mrpc", "seed:1"]

    other_seed = job_of_a_launch("trainer.per_device_train_batch_size=16",
                                 "trainer.learning_rate=2e-05", "seed=2")
    assert other_seed["group"] == logger["group"] and other_seed["name"] != logger["name"]
    other_rate = job_of_a_launch("trainer.per_device_train_batch_size=16",
                                 "trainer.learning_rate=3e-05", "seed=1")
    assert other_rate["group"] != logger["group"]


def test_a_single_run_keeps_its_group_and_name():
    logger = compose_config(["recipe=glue", "task=mrpc", "seed=3"]).logger
    assert logger.sweep_id is None
    assert logger.group == "glue-mrpc"
    assert logger.name.startswith("mrpc-seed3-")


def test_keys_are_shortened_to_a_distinct_suffix_and_long_names_stay_unique():
    keys = ["trainer.learning_rate", "seed", "trainer.seed", "model.config.hidden_size"]
    assert [short_key(key, keys) for key in keys] == [
        "learning_rate", "seed", "trainer.seed", "hidden_size"]
    long = [f"{'x' * 200}{i}" for i in range(2)]
    fitted = [fit(text, MAX_NAME_LENGTH) for text in long]
    assert all(len(text) == MAX_NAME_LENGTH for text in fitted)
    assert fitted[0] != fitted[1]
    assert fit("short", MAX_NAME_LENGTH) == "short"
