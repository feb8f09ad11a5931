"""The config's schemas (bertkit.config_schema): a wrong trainer type is refused when the config
is composed, a value out of range (and a wrong type in the nodes recipes extend) before the job
starts, each naming the key; defaults are TrainingArguments' own, and Trainer's other
arguments can still be added."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf
from transformers import TrainingArguments

from bertkit import config_schema
from bertkit.cli import composition_message
from bertkit.config_paths import recipes_dir
from bertkit.config_schema import TrainerSchema, check_ranges
from bertkit.errors import BertkitError
from bertkit.jobs import run_job
from bertkit.pretraining.run import pretrain
from bertkit.tasks import task_family
from bertkit.training.finetune import finetune
from tests.conftest import compose_config


@pytest.mark.parametrize("override, message", [
    ("trainer.per_device_train_batch_size=0",
     "trainer.per_device_train_batch_size=0: expected a number >= 1"),
    ("trainer.per_device_eval_batch_size=-8",
     "trainer.per_device_eval_batch_size=-8: expected a number >= 1"),
    ("trainer.gradient_accumulation_steps=0",
     "trainer.gradient_accumulation_steps=0: expected a number >= 1"),
    ("trainer.num_train_epochs=-1", "trainer.num_train_epochs=-1: expected a positive number"),
    ("trainer.learning_rate=0", "trainer.learning_rate=0.0: expected a number > 0 and <= 1"),
    # a typo of 2e-5 (issue 50)
    ("trainer.learning_rate=2e5", "trainer.learning_rate=200000.0: expected a number > 0 and "
                                  "<= 1"),
    ("trainer.adam_beta2=1.0", "trainer.adam_beta2=1.0: expected a number >= 0 and < 1"),
    ("trainer.warmup_steps=-5", "trainer.warmup_steps=-5.0: expected a number >= 0"),
    ("trainer.max_steps=-2", "trainer.max_steps=-2: expected a number >= -1"),
    ("trainer.logging_steps=0", "trainer.logging_steps=0.0: expected a positive number"),
    ("trainer.num_train_epochs=three", "trainer.num_train_epochs='three': expected a number"),
    # The task node (bertkit.config_schema.SETTINGS) and the typed root: type and range at the
    # edge.
    ("task.max_seq_length=0", "task.max_seq_length=0: expected an integer of at least 3"),
    ("task.max_seq_length=64.5", "task.max_seq_length=64.5: expected an integer of at least 3"),
    ("pad_to_multiple_of=0", "pad_to_multiple_of=0: expected a number >= 1"),
    ("pad_to_multiple_of=8.5", "pad_to_multiple_of=8.5: expected an integer or null"),
    ("preprocessing_num_workers=0", "preprocessing_num_workers=0: expected a number >= 1"),
    ("gpu_dataloader_workers=-1", "gpu_dataloader_workers=-1: expected a number >= 0"),
    ("seed=x", "seed='x': expected an integer in [0, 2**32 - 1] (numpy's and torch's seeds)"),
    ("seed=-1", "seed=-1: expected an integer in [0, 2**32 - 1] (numpy's and torch's seeds)"),
    # A typed float holds 0 as 0.0 (as the trainer's learning_rate does).
    ("train_fraction=0", "train_fraction=0.0: expected a number in (0, 1], or null for the "
                         "whole schedule"),
    ("early_stopping.threshold=-0.1", "early_stopping.threshold=-0.1: expected a number >= 0"),
    ("budget.min_lr_ratio=2", "budget.min_lr_ratio=2.0: expected a share of the peak learning "
                              "rate in [0, 1]"),
])
def test_a_value_out_of_range_is_refused_before_the_run_starts(override, message, tmp_path):
    """Refused as the config is composed (a typed node's wrong type: bertkit's one line, as
    the command prints it) or as the job starts (a range), in the same words."""
    try:
        cfg = compose_config([override])
    except ConfigCompositionException as err:
        assert composition_message(err) == message
        return
    with pytest.raises(BertkitError, match="^" + re.escape(message) + "$"):
        run_job(cfg, run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_job_called_from_python_is_checked_too(tmp_path):
    """finetune() without run_job (a notebook, two-stage finetuning) still refuses a bad value
    before any data is read."""
    cfg = compose_config(["task.max_seq_length=0", f"cache_dir={tmp_path / 'cache'}"])
    with pytest.raises(BertkitError, match=r"^task\.max_seq_length=0: expected an integer"):
        finetune(cfg, task_family(cfg.task.family), tmp_path / "run")
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()


def test_pretraining_called_from_python_is_checked_too(tmp_path):
    """pretrain() without run_job refuses a bad value before any data is read: the schema is
    checked once, by check_pretraining_config, not again by the run's shared start."""
    cfg = compose_config(["recipe=pretrain", "heldout.batch_size=0",
                          f"cache_dir={tmp_path / 'cache'}"])
    with pytest.raises(BertkitError, match=r"^heldout\.batch_size=0: expected a number >= 1$"):
        pretrain(cfg, tmp_path / "run")
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()


@pytest.mark.parametrize("override", ["trainer.per_device_train_batch_size=abc",
                                      "trainer.learning_rate=fast",
                                      "trainer.load_best_model_at_end=maybe"])
def test_a_value_of_the_wrong_type_is_refused_when_composed_naming_the_key(override):
    with pytest.raises(ConfigCompositionException) as error:
        compose_config([override])
    assert f"full_key: {override.split('=')[0]}" in str(error.value.__cause__)


@pytest.mark.parametrize("recipe", ["recipe=glue", "recipe=pretrain"])
def test_defaults_are_trainer_arguments_own_and_the_yaml_values_win(recipe):
    trainer = compose_config([recipe]).trainer
    arguments = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}
    for spec in dataclasses.fields(TrainerSchema):
        assert spec.default == arguments[spec.name], spec.name
    assert trainer.adam_epsilon == 1e-6  # the paper's, not Trainer's 1e-8
    if recipe == "recipe=pretrain":
        assert trainer.learning_rate == 1e-4 and trainer.warmup_steps == 10000
        assert trainer.dataloader_num_workers == "auto"
        assert trainer.num_train_epochs == arguments["num_train_epochs"]  # not in its YAML
    else:
        assert trainer.learning_rate == 2e-5 and trainer.dataloader_num_workers == 0


def test_other_trainer_arguments_can_still_be_added():
    trainer = compose_config(["+trainer.label_smoothing_factor=0.1"]).trainer
    assert trainer.label_smoothing_factor == 0.1


RECIPES = sorted(path.stem for path in (Path(recipes_dir()) / "recipe").glob("*.yaml"))
EXPERIMENTS = sorted(path.stem for path in (Path(recipes_dir()) / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("selection", [f"recipe={name}" for name in RECIPES]
                         + [f"experiment={name}" for name in EXPERIMENTS])
def test_every_recipe_and_preset_composes_against_the_schema(selection):
    """A recipe's YAML cannot add a trainer key the schema lacks (a benchmark's
    logging_strategy did): each one composes, and its values are within every schema's
    bounds."""
    cfg = compose_config(selection.split())
    assert cfg.trainer.learning_rate > 0
    check_ranges(cfg)


def test_a_task_family_may_keep_keys_of_its_own():
    """The task node is held to the keys every family reads, not closed: NER's tag scheme and
    SQuAD's doc stride pass untouched."""
    for recipe, key in (("recipe=ner", "tag_scheme"), ("recipe=squad", "doc_stride")):
        cfg = compose_config([recipe])
        check_ranges(cfg)
        assert key in cfg.task


def test_gradual_unfreezing_by_epoch_passes_the_schema():
    """finetuning.unfreeze_every=epoch is documented (docs: gradual unfreezing); the schema
    refused it as 'expected a number' while a count of 0 is still refused naming the key."""
    check_ranges(compose_config(["finetuning=gradual_unfreezing",
                                 "finetuning.unfreeze_every=epoch"]))
    with pytest.raises(BertkitError, match=r"^finetuning\.unfreeze_every=0: expected epoch, "):
        check_ranges(compose_config(["finetuning=gradual_unfreezing",
                                     "finetuning.unfreeze_every=0"]))


def test_the_schema_is_checked_once_per_job(monkeypatch):
    """run_job checks the config as the job starts (checked_once); the job's own calls
    (finetune's, check_pretraining_config's) pass that config as checked, while a config the
    job derives from it (two-stage finetuning's stages) and any call after the job are checked."""
    walks = []
    walk = config_schema.nodes
    monkeypatch.setattr(config_schema, "nodes",
                        lambda cfg, path: walks.append(path) or walk(cfg, path))
    cfg = compose_config([])
    once = len(config_schema.SETTINGS) + len(config_schema.SCHEMAS)
    with config_schema.checked_once(cfg):
        assert len(walks) == once
        check_ranges(cfg)
        assert len(walks) == once
        check_ranges(cfg.copy())
        assert len(walks) == 2 * once
    cfg.seed = -1
    with pytest.raises(BertkitError, match=r"^seed=-1: "):
        check_ranges(cfg)


def boolean_choice_fields() -> dict[str, dataclasses.Field]:
    """key -> field, for every schema field whose choices hold true or false beside words
    (auto | true | false: pretraining.padding_free, trainer.torch_compile, ...), found by the
    schema, not by name."""
    found = {}
    for path, schema in {**config_schema.SETTINGS, **config_schema.SCHEMAS}.items():
        for spec in dataclasses.fields(schema):
            choices = config_schema.choices_of(dict(spec.metadata))
            if choices and any(isinstance(choice, bool) for choice in choices):
                found[".".join([*path.replace("*", "x").split("."), spec.name]).lstrip(".")] = spec
    return found


def _config_with(key: str, value) -> DictConfig:
    """A config holding `key` alone (what check_ranges reads of it)."""
    node = value
    for part in reversed(key.split(".")):
        node = {part: node}
    return OmegaConf.create(node)


def test_boolean_choices_are_found_by_the_schema():
    assert {"pretraining.padding_free", "trainer.torch_compile", "progress_bars"} <= set(
        boolean_choice_fields())


@pytest.mark.parametrize("key", sorted(boolean_choice_fields()))
def test_a_boolean_choice_accepts_only_its_own_spelling(key):
    """0 and 1 were taken for false and true (Python's 1 == True) and a bad word was told
    "expected one of auto, True, False": now each is refused naming the key, and the choices
    are spelled as a user types them."""
    metadata = dict(boolean_choice_fields()[key].metadata)
    choices = config_schema.choices_of(metadata)
    typed = ", ".join({True: "true", False: "false"}.get(choice, choice)
                      if isinstance(choice, bool) else str(choice) for choice in choices)
    # A switch (true or false only) says so in its own words.
    expected = metadata.get("expect") or f"one of {typed}"
    for value in (0, 1, "yes"):
        with pytest.raises(BertkitError) as error:
            check_ranges(_config_with(key, value))
        assert str(error.value) == f"{key}={value!r}: expected {expected}"
    for value in choices:
        check_ranges(_config_with(key, value))


# Each choice list the schema writes out -> the list its reader keeps ("module:NAME"): the
# schema's copy lets a config be checked without importing torch or transformers.
CHOICE_SOURCES = {
    "SCHEDULERS": "transformers.trainer_utils:SchedulerType",
    "OPTIMIZERS": "transformers.training_args:OptimizerNames",
    "INTERVALS": "transformers.trainer_utils:IntervalStrategy",
    "SAVE_INTERVALS": "transformers.trainer_utils:SaveStrategy",
    "ACTIVATIONS": "transformers.activations:ACT2FN",
    "COMPILE_MODES": "bertkit.training.trainer:COMPILE_MODES",
    "PRECISIONS": "bertkit.training.run:PRECISIONS",
    "DATA_SOURCES": "bertkit.data.task_data:DATA_SOURCES",
    "ATTENTION": "bertkit.training.models:CHOICES",
    "TAG_SCHEMES": "bertkit.tasks.ner.files:TAG_SCHEMES",
    "NER_LAYERS": "bertkit.tasks.ner.feature_based_tagger:LAYER_COMBINATIONS",
    "NER_CLASSIFIERS": "bertkit.tasks.ner.feature_based_tagger:CLASSIFIERS",
    "POOLING": "bertkit.finetuning.methods:POOLING",
    "NOISE": "bertkit.finetuning.methods:NOISE",
    "MASKING_KINDS": "bertkit.pretraining.run:MASKING_KINDS",
    "MASKING_UNITS": "bertkit.pretraining.masking:UNITS",
    "MASKING_CONVENTIONS": "bertkit.pretraining.masking:CONVENTIONS",
    "CORPUS_FORMATS": "bertkit.pretraining.corpora:FORMATS",
}


def _choice_words(found) -> tuple:
    """A reader's list as a config spells its items (an Enum by its word)."""
    import enum

    return tuple(item.value if isinstance(item, enum.Enum) and isinstance(item.value, str)
                 else item.name if isinstance(item, enum.Enum) else item for item in found)


@pytest.mark.parametrize("name", sorted(CHOICE_SOURCES))
def test_the_schemas_choices_are_their_readers_own(name):
    import importlib

    module, attribute = CHOICE_SOURCES[name].split(":")
    readers = _choice_words(getattr(importlib.import_module(module), attribute))
    assert sorted(map(str, getattr(config_schema, name))) == sorted(map(str, readers)), name


def test_train_sampling_choices_are_training_arguments_own():
    metadata = {f.name: f for f in dataclasses.fields(TrainingArguments)}[
        "train_sampling_strategy"].metadata
    assert list(config_schema.SAMPLING) == list(metadata["choices"])


def test_the_auto_or_boolean_settings_are_their_readers_own():
    from bertkit.pretraining.batches import SETTINGS
    from bertkit.training.run import PROGRESS_BARS

    for readers in (SETTINGS, PROGRESS_BARS):
        assert tuple(readers) == config_schema.AUTO_OR_BOOL
