"""Where bertkit's Hydra configs live: conf/ (the building blocks) and recipes/ (the named
recipes and experiment presets), in a source checkout or in an installed copy.

Kept free of heavy imports: the Hydra search-path plugin (hydra_plugins/bertkit_recipes) reads
it whenever any Hydra app in the environment builds its search path.
"""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent


def config_dir() -> str:
    """conf/ of a source checkout, else the packaged copy (pyproject's force-include)."""
    source = _HERE.parent / "conf"
    return str(source if source.is_dir() else _HERE / "_conf")


def recipes_dir() -> str:
    """The folder holding the recipe/ and experiment/ config groups: recipes/ of a source
    checkout, else the packaged copy. Everything under it is a config to Hydra, which is why
    the result cards and their run records live in cards/ beside it."""
    source = _HERE.parent / "recipes"
    return str(source if (source / "recipe").is_dir() else _HERE / "_recipes")
