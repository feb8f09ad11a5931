"""Typed schemas of the config, so that a bad value is refused at the edge, naming the key.

The trainer group's schema is in Hydra's ConfigStore (as the halving sweeper's): its YAML files
list it first in `defaults`, so OmegaConf refuses a value of the wrong type at composition.
Its defaults are TrainingArguments' own, so a key a YAML leaves out behaves as if it were not
given. Nodes that recipes and task families extend with keys of their own (the root, task,
budget) cannot be closed that way: their schemas (SETTINGS) name the keys every run shares,
and check_ranges holds the composed values to them, type by OmegaConf, before a job starts.
What a type cannot say (a batch of 0, a share above 1, a word not in a list) is in each
field's metadata: min, above, max, below, choices, and `expect`, the message's wording.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf, ValidationError
from transformers import TrainingArguments

from bertkit.errors import BertkitError

_ARGUMENTS = {f.name: f for f in dataclasses.fields(TrainingArguments)}


def _argument(name: str, **bounds) -> Any:
    """A TrainingArguments field with its own default; bounds: min, above, below (numbers)."""
    return field(default=_ARGUMENTS[name].default, metadata=bounds)


def _setting(default: Any, expect: str | None = None, **bounds) -> Any:
    """A field with its bounds and, optionally, what the message says is expected."""
    return field(default=default, metadata={**bounds, **({"expect": expect} if expect else {})})


@dataclass
class TrainerSchema:
    """The trainer group (conf/trainer/): TrainingArguments by their own names, those that
    bertkit's YAML files set. Any other TrainingArguments key can still be added with
    +trainer.NAME=VALUE on a command line; a YAML that sets one must add it here."""

    learning_rate: float = _argument("learning_rate", above=0)
    per_device_train_batch_size: int = _argument("per_device_train_batch_size", min=1)
    per_device_eval_batch_size: int = _argument("per_device_eval_batch_size", min=1)
    gradient_accumulation_steps: int = _argument("gradient_accumulation_steps", min=1)
    # Any, checked as a number by check_ranges: 2 stays 2 in sweep directory names (ep2).
    num_train_epochs: Any = _argument("num_train_epochs", above=0)
    max_steps: int = _argument("max_steps", min=-1)  # -1: train by epochs
    warmup_steps: float = _argument("warmup_steps", min=0)  # below 1: a share of all steps
    lr_scheduler_type: str = _argument("lr_scheduler_type")
    weight_decay: float = _argument("weight_decay", min=0)
    adam_beta1: float = _argument("adam_beta1", min=0, below=1)
    adam_beta2: float = _argument("adam_beta2", min=0, below=1)
    adam_epsilon: float = _argument("adam_epsilon", above=0)
    max_grad_norm: float = _argument("max_grad_norm", min=0)
    optim: str = _argument("optim")
    seed: int = _argument("seed")
    train_sampling_strategy: str = _argument("train_sampling_strategy")
    eval_strategy: str = _argument("eval_strategy")
    eval_steps: float | None = _argument("eval_steps", above=0)
    save_strategy: str = _argument("save_strategy")
    save_steps: float = _argument("save_steps", above=0)
    save_total_limit: int | None = _argument("save_total_limit", min=1)
    metric_for_best_model: str | None = _argument("metric_for_best_model")
    load_best_model_at_end: bool = _argument("load_best_model_at_end")
    logging_strategy: str = _argument("logging_strategy")
    logging_steps: float = _argument("logging_steps", above=0)
    logging_first_step: bool = _argument("logging_first_step")
    # auto or a number of worker processes (bertkit.training.arguments checks it).
    dataloader_num_workers: Any = _argument("dataloader_num_workers")
    dataloader_persistent_workers: bool = _argument("dataloader_persistent_workers")
    dataloader_prefetch_factor: int | None = _argument("dataloader_prefetch_factor", min=1)
    include_num_input_tokens_seen: Any = _argument("include_num_input_tokens_seen")
    torch_compile: bool = _argument("torch_compile")
    torch_compile_mode: str | None = _argument("torch_compile_mode")
    ddp_find_unused_parameters: bool | None = _argument("ddp_find_unused_parameters")
    disable_tqdm: bool | None = _argument("disable_tqdm")
    push_to_hub: bool = _argument("push_to_hub")
    hub_model_id: str | None = _argument("hub_model_id")


@dataclass
class RunSchema:
    """The root keys of conf/config.yaml that every run shares."""

    seed: int = 42
    pad_to_multiple_of: int | None = _setting(8, min=1)
    preprocessing_num_workers: int | None = _setting(1, min=1)
    gpu_dataloader_workers: int = _setting(6, min=0)
    agree_every_steps: int = _setting(10, "a positive number of optimizer steps", min=1)
    fsync_checkpoints: bool = True
    bucket_width: int = _setting(32, "a positive number of tokens (1: no buckets)", min=1)
    buckets_on_cpu: bool = False
    train_fraction: float | None = _setting(
        None, "a number in (0, 1], or null for the whole schedule", above=0, max=1)


@dataclass
class TaskSchema:
    """The keys of conf/task/ that every task family reads; a family checks its own."""

    name: str = "demo"
    family: str = "glue"
    # [CLS], one token and [SEP]; a family may need more (SWAG: two segments).
    max_seq_length: int = _setting(128, "an integer of at least 3", min=3)
    main_metric: str = "accuracy"


DECAYS = ("linear", "cosine", "constant")  # the learning rate's shape after warm-up


@dataclass
class BudgetSchema:
    """budget.* (bertkit.training.budget): training to a time budget."""

    minutes: float | None = _setting(
        None, "a positive number of minutes of training, or null (off)", above=0)
    warmup_fraction: float = _setting(0.0, "a share of the budget's time in [0, 1)",
                                      min=0, below=1)
    decay: str = _setting("linear", choices=DECAYS)
    min_lr_ratio: float = _setting(0.0, "a share of the peak learning rate in [0, 1]",
                                   min=0, max=1)


@dataclass
class EarlyStoppingSchema:
    patience: int | None = _setting(
        None, "a positive integer (or null to turn early stopping off)", min=1)
    threshold: float = _setting(0.0, min=0)


# group -> its schema, stored as <group>/schema: a YAML of the group lists `schema` first.
SCHEMAS = {"trainer": TrainerSchema}
# node -> the schema of the keys it must hold to (the root: ""); checked, not composed.
SETTINGS = {"": RunSchema, "task": TaskSchema, "budget": BudgetSchema,
            "early_stopping": EarlyStoppingSchema}


def register_schemas() -> None:
    store = ConfigStore.instance()
    for group, schema in SCHEMAS.items():
        store.store(group=group, name="schema", node=schema)


def _out_of_range(value, bounds: dict) -> str | None:
    """What the value breaks, as "expected ..."; None when it is within bounds."""
    if value is None or not bounds:
        return None
    choices = bounds.get("choices")
    if choices is not None:
        return None if value in choices else f"expected one of {', '.join(choices)}"
    numeric = {key: bounds[key] for key in ("min", "above", "max", "below") if key in bounds}
    if not numeric:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "expected a number"
    broken = {"min": lambda b: value < b, "above": lambda b: not value > b,
              "max": lambda b: value > b, "below": lambda b: not value < b}
    if not any(broken[key](bound) for key, bound in numeric.items()):
        return None
    if numeric == {"above": 0}:
        return "expected a positive number"
    signs = {"min": ">=", "above": ">", "max": "<=", "below": "<"}
    return "expected a number " + " and ".join(f"{signs[key]} {bound}"
                                               for key, bound in numeric.items())


_TYPE_WORDS = {"int": "an integer", "float": "a number", "str": "a string",
               "bool": "true or false", "None": "null"}


def _type_problem(typed: DictConfig, name: str, value) -> bool:
    """True when OmegaConf refuses `value` for the field of the structured config `typed`
    (e.g. a word for an integer)."""
    try:
        OmegaConf.merge(typed, {name: value})
    except (ValidationError, ValueError):
        return True
    return False


def _check_node(path: str, node: DictConfig, schema: type, typed: bool) -> None:
    """`typed`: OmegaConf checked the types at composition already (a ConfigStore schema)."""
    structured = None if typed else OmegaConf.structured(schema)
    for spec in dataclasses.fields(schema):
        if spec.name not in node:
            continue
        value = node.get(spec.name)
        problem = _out_of_range(value, dict(spec.metadata))
        if problem is None and structured is not None \
                and _type_problem(structured, spec.name, value):
            problem = "expected " + " or ".join(_TYPE_WORDS.get(name.strip(), name.strip())
                                                for name in str(spec.type).split("|"))
        if problem:
            key = f"{path}.{spec.name}" if path else spec.name
            expect = spec.metadata.get("expect")
            raise BertkitError(f"{key}={value!r}: " + (f"expected {expect}" if expect
                                                       else problem))


def check_ranges(cfg: DictConfig) -> None:
    """The config's values held to their schemas, before a job starts: the composed groups'
    ranges (their types were checked at composition), and the SETTINGS nodes' types and
    ranges."""
    for path, schema in SETTINGS.items():  # first: the trainer group interpolates the root's
        node = OmegaConf.select(cfg, path) if path else cfg
        if isinstance(node, DictConfig):
            _check_node(path, node, schema, typed=False)
    for group, schema in SCHEMAS.items():
        node = OmegaConf.select(cfg, group)
        if node is not None:
            _check_node(group, node, schema, typed=True)


register_schemas()
