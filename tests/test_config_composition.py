"""The config tree composes for every task and recipe, carries the paper's finetuning
defaults, and rejects a typo with a message that names the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import OmegaConf

from bertkit.config_paths import recipes_dir
from bertkit.config_schema import check_ranges
from bertkit.config_tree import config_dir
from bertkit.errors import BertkitError
from bertkit.tasks.glue.metrics import METRICS
from bertkit.training.models import dropout_settings
from tests.conftest import GLUE_TASKS, PROTOCOLS, compose_config

PAPER_FINETUNING = {
    "learning_rate": 2e-5, "per_device_train_batch_size": 32, "num_train_epochs": 3,
    "warmup_steps": 0.1, "lr_scheduler_type": "linear", "weight_decay": 0.01,
    "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-6, "max_grad_norm": 1.0,
}


@pytest.mark.parametrize("task", GLUE_TASKS)
def test_glue_task_composes_with_paper_defaults(task):
    cfg = compose_config(["recipe=glue", f"task={task}"])
    assert cfg.task.name == task
    assert cfg.recipe.task_family == cfg.task.family == "glue"
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


PAPER_PRETRAINING = {
    "learning_rate": 1e-4, "per_device_train_batch_size": 256, "max_steps": 1_000_000,
    "warmup_steps": 10_000, "lr_scheduler_type": "linear", "weight_decay": 0.01,
    "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-6,
}


def test_pretrain_recipe_carries_the_paper_defaults():
    cfg = compose_config(["recipe=pretrain"])
    for key, value in PAPER_PRETRAINING.items():
        assert cfg.trainer[key] == value, key
    assert "task" not in cfg
    assert cfg.model.config.hidden_size == 768 and cfg.model.config.num_hidden_layers == 12
    assert cfg.model.config.num_attention_heads == 12 and cfg.model.config.hidden_act == "gelu"
    assert cfg.model.hidden_dropout_prob == 0.1
    assert cfg.objective.name == "mlm_nsp" and cfg.objective.sentence_task == "nsp"
    masking = cfg.masking
    assert (masking.kind, masking.dupe_factor, masking.mlm_probability) == ("static", 10, 0.15)
    assert (masking.mask_token_fraction, masking.random_token_fraction) == (0.8, 0.1)
    assert cfg.pretraining.max_seq_length == 128 and cfg.pretraining.short_seq_prob == 0.1
    long_phase = cfg.pretraining.long_phase
    assert (long_phase.fraction, long_phase.max_seq_length) == (0.1, 512)
    assert cfg.corpus.name == "wikipedia" and cfg.corpus.hub.streaming is False
    assert cfg.recipe.dataset == "wikipedia"


@pytest.mark.parametrize("objective,task,packing", [
    ("mlm_nsp", "nsp", "pairs"), ("mlm", None, "full_sentences"), ("sop", "sop", "pairs")])
def test_objectives_compose(objective, task, packing):
    cfg = compose_config(["recipe=pretrain", f"objective={objective}", "masking=dynamic"])
    assert (cfg.objective.sentence_task, cfg.objective.packing) == (task, packing)
    # dupe_factor: static masking's copies, the schema's default, unread by dynamic masking.
    assert cfg.masking.kind == "dynamic" and cfg.masking.dupe_factor == 10


def test_small_and_ablation_presets_run_offline():
    small = compose_config(["experiment=pretrain_small"])
    assert small.recipe.job == "pretrain" and small.recipe.name == "pretrain_small"
    assert small.corpus.name == "wikitext2" and small.corpus.source == "local"
    assert small.model.tokenizer.endswith("vocab/bert-base-uncased")
    assert small.pretraining.long_phase.fraction == 0.0
    ablation = compose_config(["experiment=pretrain_ablation"], with_hydra=True)
    assert ablation.hydra.runtime.choices.sweep == "pretrain_ablation"  # chosen by the preset
    assert ablation.trainer.max_steps == small.trainer.max_steps
    assert ablation.hydra.sweeper.params == {"masking": "static,dynamic",
                                             "objective": "mlm_nsp,mlm"}
    assert list(ablation.downstream.tasks) == ["rte"]
    # The preset's sweep names the job directories, not the primary config.
    hydra = OmegaConf.to_container(ablation.hydra.sweep, resolve=False)
    assert hydra["subdir"] == "${masking.kind}-${objective.name}/seed${seed}"


@pytest.mark.parametrize(("task", "version", "epochs", "hub"), [
    ("squad_v1", "v1.1", 3, "rajpurkar/squad"),
    ("squad_v2", "v2.0", 2, "rajpurkar/squad_v2"),
])
def test_squad_recipe_carries_the_paper_defaults(task, version, epochs, hub):
    cfg = compose_config(["recipe=squad", f"task={task}"])
    assert (cfg.task.version, cfg.task.hub.path, cfg.task.family) == (version, hub, "squad")
    assert (cfg.task.max_seq_length, cfg.task.doc_stride, cfg.task.max_query_length) == (
        384, 128, 64)
    assert (cfg.task.n_best_size, cfg.task.max_answer_length) == (20, 30)
    trainer = cfg.trainer
    assert (trainer.learning_rate, trainer.per_device_train_batch_size,
            trainer.num_train_epochs, trainer.warmup_steps) == (5e-5, 32, epochs, 0.1)
    assert (trainer.weight_decay, trainer.max_grad_norm) == (0.01, 1.0)
    assert trainer.metric_for_best_model == "f1" and trainer.load_best_model_at_end
    assert cfg.model.name_or_path == "bert-base-uncased"
    # An override of the schedule still wins over the task's paper value.
    assert compose_config(["recipe=squad", f"task={task}",
                           "trainer.num_train_epochs=1"]).trainer.num_train_epochs == 1


# A GLUE-like task is a short YAML: the keys every GLUE task shares are in conf/task/glue/.
GLUE_TASK_MAX_LINES = 16
GLUE_TASK_KEYS = {
    "name", "family", "hub", "data_dir", "train_file", "validation_file", "test_file", "files",
    "columns", "headerless_splits", "headerless_columns", "labels", "class_names", "label_range",
    "metrics", "main_metric", "max_seq_length", "leaderboard_files", "skip_malformed_rows",
    "max_train_samples", "max_eval_samples", "max_predict_samples"}


@pytest.mark.parametrize("task", GLUE_TASKS)
def test_glue_task_is_a_short_yaml_on_the_shared_base(task):
    text = (Path(config_dir()) / "task" / f"{task}.yaml").read_text(encoding="utf-8")
    composed = compose_config(["recipe=glue", f"task={task}"]).task
    if "glue/standard@_here_" in text:
        assert len(text.splitlines()) <= GLUE_TASK_MAX_LINES
    else:  # MNLI: glue/base and its own file layout, a line per split
        assert "glue/base@_here_" in text
        assert len(text.splitlines()) <= GLUE_TASK_MAX_LINES + len(composed.files) + 1
    assert set(composed) == GLUE_TASK_KEYS
    assert not OmegaConf.missing_keys(composed)  # the task gives every ??? of the base
    assert composed.hub.name == task and composed.family == "glue"


@pytest.mark.parametrize("base", ["glue/base", "glue/standard"])
def test_the_glue_base_is_not_a_task(base):
    task = compose_config(["recipe=glue", f"task={base}"]).task
    missing = {key.removeprefix("task.") for key in OmegaConf.missing_keys(task)}
    assert {"name", "metrics", "main_metric", "labels", "class_names",
            "leaderboard_files"} <= missing


def test_presets_are_their_own_group_and_pick_their_recipe():
    feature_based = compose_config(["experiment=ner_feature_based"], with_hydra=True)
    assert feature_based.hydra.runtime.choices.recipe == "ner"
    assert feature_based.recipe.name == "ner_feature_based"
    assert feature_based.model.feature_based.enabled is True
    # the preset's keys win over its recipe's, a command-line key over both
    assert feature_based.trainer.learning_rate == 1e-3
    assert compose_config(["experiment=ner_feature_based", "trainer.learning_rate=2e-3"]
                          ).trainer.learning_rate == 2e-3
    with pytest.raises(MissingConfigException):
        compose_config(["recipe=pretrain_small"])  # a preset, not a recipe



def test_each_calibrated_task_has_a_protocol():
    assert PROTOCOLS == ["minilm_cola", "minilm_mrpc", "minilm_sst2", "minilm_stsb"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_protocol_sets_its_task_and_wins_over_the_recipe(protocol):
    written = OmegaConf.load(Path(recipes_dir()) / "experiment" / f"{protocol}.yaml").trainer
    cfg = compose_config(["recipe=glue", f"experiment={protocol}"])
    assert cfg.task.name == protocol.removeprefix("minilm_")
    assert cfg.model.name_or_path.endswith("all-MiniLM-L6-v2")
    assert cfg.recipe.name == "glue"
    for key, value in written.items():
        assert cfg.trainer[key] == value, key
    # Its settings are not the paper's, so this checks that the protocol is applied last.
    assert any(written[key] != PAPER_FINETUNING[key] for key in written)
    # The paper's other settings stay as they are.
    assert cfg.trainer.warmup_steps == PAPER_FINETUNING["warmup_steps"]
    assert cfg.trainer.weight_decay == PAPER_FINETUNING["weight_decay"]
    # A command-line setting still wins over the protocol's.
    assert compose_config(["recipe=glue", f"experiment={protocol}",
                           "trainer.learning_rate=3e-5"]).trainer.learning_rate == 3e-5


def test_the_speed_over_fidelity_preset_composes_and_is_never_the_default():
    fast = compose_config(["experiment=pretrain_speed_over_fidelity"])
    check_ranges(fast)
    assert fast.recipe.job == "pretrain" and fast.recipe.name == "pretrain_speed_over_fidelity"
    assert fast.model.hidden_dropout_prob == fast.model.attention_probs_dropout_prob == 0.0
    assert dropout_settings(fast.model) == {"hidden_dropout_prob": 0.0,
                                            "attention_probs_dropout_prob": 0.0}
    assert fast.trainer.torch_compile is True
    assert fast.trainer.torch_compile_mode == "reduce-overhead"
    assert fast.pretraining.pad_vocab_to_multiple_of == 64
    # The rest is the paper's recipe.
    assert fast.trainer.learning_rate == 1e-4 and fast.masking.kind == "static"
    default = compose_config(["recipe=pretrain"])
    assert dropout_settings(default.model) == {"hidden_dropout_prob": 0.1,
                                               "attention_probs_dropout_prob": 0.1}
    assert default.trainer.torch_compile is False and default.trainer.torch_compile_mode is None
    assert default.pretraining.pad_vocab_to_multiple_of == 64


def test_torch_compile_mode_takes_torch_compiles_modes_only():
    for mode in ("max-autotune", "reduce-overhead", "max-autotune-no-cudagraphs"):
        check_ranges(compose_config(["recipe=pretrain", f"trainer.torch_compile_mode={mode}"]))
    with pytest.raises(BertkitError, match=r"^trainer.torch_compile_mode='max-autotun'.*"
                                           r"max-autotune"):
        check_ranges(compose_config(["recipe=pretrain", "trainer.torch_compile_mode=max-autotun"]))
    with pytest.raises(BertkitError, match=r"pretraining.pad_vocab_to_multiple_of"):
        check_ranges(compose_config(["recipe=pretrain", "pretraining.pad_vocab_to_multiple_of=0"]))
