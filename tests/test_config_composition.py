"""The config tree composes for every task and recipe, carries the paper's finetuning
defaults, and rejects a typo with a message that names the key."""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException

from bertkit.glue_metrics import METRICS
from tests.conftest import GLUE_TASKS, compose_config

PAPER_FINETUNING = {
    "learning_rate": 2e-5, "per_device_train_batch_size": 32, "num_train_epochs": 3,
    "warmup_steps": 0.1, "lr_scheduler_type": "linear", "weight_decay": 0.01,
    "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-6, "max_grad_norm": 1.0,
}


@pytest.mark.parametrize("task", GLUE_TASKS)
def test_glue_task_composes_with_paper_defaults(task):
    cfg = compose_config(["recipe=glue", f"task={task}"])
    assert cfg.task.name == task
    assert cfg.recipe.family == "glue"
    assert cfg.model.name_or_path == "bert-base-uncased"
    for key, value in PAPER_FINETUNING.items():
        assert cfg.trainer[key] == value, key
    assert cfg.task.max_seq_length == 128
    assert cfg.model.hidden_dropout_prob == cfg.model.attention_probs_dropout_prob == 0.1
    assert set(cfg.task.metrics) <= set(METRICS)
    assert cfg.task.main_metric in cfg.task.metrics
    assert cfg.task.hub.path == "nyu-mll/glue"
    assert any(split.startswith("validation") for split in cfg.task.files)
    assert set(cfg.task.leaderboard_files) <= set(cfg.task.files)


def test_glue_metrics_follow_the_glue_paper():
    metrics = {task: set(compose_config(["recipe=glue", f"task={task}"]).task.metrics)
               for task in GLUE_TASKS}
    assert metrics == {
        "cola": {"matthews_correlation"}, "sst2": {"accuracy"}, "mrpc": {"f1", "accuracy"},
        "stsb": {"pearson", "spearman"}, "qqp": {"f1", "accuracy"}, "mnli": {"accuracy"},
        "qnli": {"accuracy"}, "rte": {"accuracy"}, "wnli": {"accuracy"},
    }


def test_demo_is_the_default_and_needs_no_network():
    cfg = compose_config([])
    assert cfg.recipe.name == "demo"
    assert cfg.task.hub is None and cfg.model.name_or_path is None
    assert cfg.model.tokenizer == cfg.task.data_dir


def test_typo_in_override_names_the_key():
    with pytest.raises(ConfigCompositionException, match="trainer.learnin_rate"):
        compose_config(["recipe=glue", "task=rte", "trainer.learnin_rate=1e-5"])


def test_unknown_task_is_reported():
    with pytest.raises(MissingConfigException, match="mrcp"):
        compose_config(["recipe=glue", "task=mrcp"])
