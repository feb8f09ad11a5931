"""The `finetuning` config node, checked before any data is read (each key's type and range
by the schema, bertkit.config_schema; the rules between keys by the methods), and described
by plain names for metrics.json and the W&B config. Each key belongs to one registered method
(bertkit.finetuning.method), which checks its rules and trims it."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from bertkit.finetuning.method import registered


def check_settings(settings: DictConfig, num_layers: int | None = None) -> None:
    """Every method's keys, on or off; num_layers (the model's, once known) bounds layer
    counts."""
    for method in registered():
        method.check(settings, num_layers)


def is_plain(settings: DictConfig) -> bool:
    """Nothing on: the run is the paper's full finetuning, through Trainer's own optimizer."""
    return not any(method.active(settings) for method in registered())


def describe(settings: DictConfig) -> dict:
    """The node by plain names (metrics.json "finetuning", W&B config finetuning.*)."""
    plain = OmegaConf.to_container(settings, resolve=True)
    for method in registered():
        method.describe(plain)
    if plain["intermediate"]["task"] is None:  # two-stage finetuning (bertkit.jobs.two_stage)
        plain["intermediate"] = {"task": None}
    return plain
