"""Where bertkit's Hydra config tree lives, and composing a config from it outside `bertkit`.

Below the CLI on purpose: pretraining's downstream finetunes compose GLUE configs from the
same tree, and must not import the entry point to find it.
"""

from __future__ import annotations

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

import bertkit.config_schema  # noqa: F401  (registers the groups' schemas with Hydra)
from bertkit.config_paths import config_dir

__all__ = ["compose_config", "config_dir", "debug_overrides"]


def compose_config(overrides: list[str]) -> DictConfig:
    """The config `bertkit <overrides>` would run. Inside a `bertkit` job Hydra is initialised
    already; a library caller (a test, a notebook) gets its own initialisation."""
    if GlobalHydra.instance().is_initialized():
        return compose(config_name="config", overrides=overrides)
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def debug_overrides(preset: str | None) -> list[str]:
    """["debug=smoke"] for a run composed with debug=smoke (preset: its debug.preset, None
    without one), else []: what the configs a job composes for itself (pretraining's
    downstream finetunes, two-stage finetuning's first task) take from it, so that they are
    smoke runs too."""
    return [f"debug={preset}"] if preset else []
