"""How a benchmark runs: `python -m benchmarks.<module> [overrides]`, from the repository's
root, composes benchmarks/conf/<config>.yaml (bertkit's primary config with the benchmark's
recipe chosen; bertkit's conf/ and recipes/ behind benchmarks/conf/ on Hydra's search path, so
that task=, model=, trainer=, corpus=, ... compose as in any bertkit run) and runs the
benchmark's job through bertkit's own command: the same one-line errors, masked secrets and
finished-run checks as `bertkit`."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from bertkit import cli
from bertkit.config_paths import config_dir, recipes_dir

CONF_DIR = Path(__file__).resolve().parent / "conf"
# bertkit's config folders, by name, for hydra.searchpath in benchmarks/conf/*.yaml.
_BERTKIT_DIRS = {"conf": config_dir, "recipes": recipes_dir}


def register_resolvers() -> None:
    """bertkit's resolvers, and ${bertkit_dir:conf|recipes} for the search path."""
    cli.register_resolvers()
    if not OmegaConf.has_resolver("bertkit_dir"):
        OmegaConf.register_new_resolver("bertkit_dir", lambda name: _BERTKIT_DIRS[name]())


def compose_config(config_name: str, overrides: list[str],
                   with_hydra: bool = False) -> DictConfig:
    """The config `python -m benchmarks.<module> <overrides>` would run (tests, notebooks)."""
    register_resolvers()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name=config_name, overrides=overrides,
                       return_hydra_config=with_hydra)


def main(job, config_name: str) -> None:
    """The command of one benchmark: its job (bertkit.jobs.Job) on its primary config."""
    register_resolvers()
    cli.main(job=job, config_path=str(CONF_DIR), config_name=config_name)
