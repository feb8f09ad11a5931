"""Appends recipes/ to the config search path of bertkit's own config tree.

Hydra calls every installed SearchPathPlugin for every Hydra app in the environment, so this
one acts only where the primary config is bertkit's conf/ (a `bertkit` run, or compose_config).
"""

from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

from bertkit.config_paths import config_dir, recipes_dir

PROVIDER = "bertkit-recipes"


def _is_bertkit_conf(search_path: str) -> bool:
    """hydra.main gives its config dir as file://<path>, initialize_config_dir as a bare path."""
    path = search_path.removeprefix("file://")
    return "://" not in path and Path(path).resolve() == Path(config_dir()).resolve()


class BertkitRecipesSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        elements = search_path.get_path()
        if any(_is_bertkit_conf(e.path) for e in elements) \
                and not any(e.provider == PROVIDER for e in elements):
            search_path.append(PROVIDER, f"file://{recipes_dir()}")
