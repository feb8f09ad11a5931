"""Typed schemas of the config groups, in Hydra's ConfigStore (as the halving sweeper's): a
group's YAML files list their schema first in `defaults`, so OmegaConf refuses a value of the
wrong type at composition, naming the key. What a type cannot say (a batch of 0, a negative
rate) is a range in the field's metadata, checked by check_ranges before a job starts, again
one message naming the key. Defaults are the library's own (TrainingArguments'), so a key a
YAML leaves out behaves as if it were not given.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from transformers import TrainingArguments

from bertkit.errors import BertkitError

_ARGUMENTS = {f.name: f for f in dataclasses.fields(TrainingArguments)}


def _argument(name: str, **bounds) -> Any:
    """A TrainingArguments field with its own default; bounds: min, above, below (numbers)."""
    return field(default=_ARGUMENTS[name].default, metadata=bounds)


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
    include_num_input_tokens_seen: Any = _argument("include_num_input_tokens_seen")
    torch_compile: bool = _argument("torch_compile")
    ddp_find_unused_parameters: bool | None = _argument("ddp_find_unused_parameters")
    disable_tqdm: bool | None = _argument("disable_tqdm")
    push_to_hub: bool = _argument("push_to_hub")
    hub_model_id: str | None = _argument("hub_model_id")


# group -> its schema, stored as <group>/schema: a YAML of the group lists `schema` first.
SCHEMAS = {"trainer": TrainerSchema}


def register_schemas() -> None:
    store = ConfigStore.instance()
    for group, schema in SCHEMAS.items():
        store.store(group=group, name="schema", node=schema)


def _out_of_range(value, bounds: dict) -> str | None:
    """What the value breaks, as "expected ..."; None when it is within bounds."""
    if value is None or not bounds:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "expected a number"
    low, above, below = bounds.get("min"), bounds.get("above"), bounds.get("below")
    if ((low is not None and value < low) or (above is not None and not value > above)
            or (below is not None and not value < below)):
        if bounds == {"above": 0}:
            return "expected a positive number"
        parts = ([f">= {low}"] if low is not None else []) + \
                ([f"> {above}"] if above is not None else []) + \
                ([f"< {below}"] if below is not None else [])
        return "expected a number " + " and ".join(parts)
    return None


def check_ranges(cfg: DictConfig) -> None:
    """Every schema'd group's values within their fields' bounds, before a job starts."""
    for group, schema in SCHEMAS.items():
        node = OmegaConf.select(cfg, group)
        if node is None:
            continue
        for spec in dataclasses.fields(schema):
            value = node.get(spec.name)
            problem = _out_of_range(value, dict(spec.metadata))
            if problem:
                raise BertkitError(f"{group}.{spec.name}={value!r}: {problem}")


register_schemas()
