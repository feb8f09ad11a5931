"""recipes/ reaches Hydra through a search-path plugin, not links in conf/: bertkit's tree gets
it (as hydra.main and compose_config name conf/), any other Hydra app in the environment not;
the result cards and their run records stay off the search path."""

from __future__ import annotations

from pathlib import Path

from hydra._internal.config_repository import ConfigRepository
from hydra._internal.utils import create_config_search_path
from hydra.core.object_type import ObjectType

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


def _config_groups(repository: ConfigRepository, parent: str = ""):
    for name in repository.get_group_options(parent, ObjectType.GROUP):
        group = f"{parent}/{name}" if parent else name
        yield group
        yield from _config_groups(repository, group)


def test_no_card_or_run_record_is_a_config():
    """The cards' run records hold config.yaml files: on the search path, each was offered as a
    config (`cards/finetuning/runs/mrpc/full/seed_1: config` in the help, 77 of them)."""
    records = list((ROOT / "cards").rglob("config.yaml"))
    assert len(records) >= 50  # the records are there, only not on Hydra's path
    search_path = create_config_search_path(config_dir())
    folders = [Path(e.path.removeprefix("file://")).resolve() for e in search_path.get_path()
               if not e.path.startswith("pkg://")]
    assert not [(folder, record) for folder in folders for record in records
                if record.is_relative_to(folder)]
    groups = list(_config_groups(ConfigRepository(search_path)))
    assert {"recipe", "experiment", "task", "trainer"} <= set(groups)
    assert not [group for group in groups if "cards" in group.split("/") or "runs" in group]
