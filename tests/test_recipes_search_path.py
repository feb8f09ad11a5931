"""recipes/ reaches Hydra through a search-path plugin, not links in conf/: bertkit's tree gets
it (as hydra.main and compose_config name conf/), any other Hydra app in the environment not."""

from __future__ import annotations

from pathlib import Path

from hydra._internal.utils import create_config_search_path

from bertkit.config_paths import config_dir, recipes_dir
from tests.conftest import compose_config

ROOT = Path(__file__).resolve().parent.parent


def _paths(search_path_dir: str) -> list[str]:
    return [element.path for element in create_config_search_path(search_path_dir).get_path()]


def test_bertkits_tree_reads_recipes_behind_conf():
    for given in (config_dir(), f"file://{config_dir()}"):  # initialize_config_dir, hydra.main
        paths = _paths(given)
        assert paths.index(f"file://{recipes_dir()}") == paths.index(given) + 1


def test_another_apps_tree_is_left_alone(tmp_path):
    assert f"file://{recipes_dir()}" not in _paths(str(tmp_path))


def test_conf_holds_no_links_and_recipes_holds_the_groups():
    assert not [p for p in Path(config_dir()).rglob("*") if p.is_symlink()]
    assert Path(recipes_dir()) == ROOT / "recipes"
    assert compose_config(["recipe=squad"]).recipe.name == "squad"
    assert compose_config(["experiment=pretrain_small"]).recipe.name == "pretrain_small"
