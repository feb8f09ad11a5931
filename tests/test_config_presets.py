"""The YAML files under conf/ and recipes/ are presets: each value they set differs from the
default its schema holds (bertkit.config_schema), so that every default lives in one place.
Generated from every YAML file and the schema: a file added tomorrow is checked the day it is.

A group's preset sits on its schema: none of its values may be the schema's default. A preset
of the whole config (a recipe, an experiment: @package _global_) sits on the presets below it
(a recipe on the groups' presets, an experiment on a recipe too): a value there may be the
schema's default where a preset below sets that key otherwise (pretrain_budget's
trainer.warmup_steps: 0 over conf/trainer/pretrain.yaml's 10000). The debug
presets are left out: their values win over whatever was chosen, defaults included. The bench_*
recipes are left to the benchmarks' own folder (issue 62, item 3)."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest
from omegaconf import MISSING, DictConfig, OmegaConf

from bertkit import config_schema
from bertkit.config_paths import config_dir, recipes_dir

ROOTS = (Path(config_dir()), Path(recipes_dir()))
PRESETS = sorted(path for root in ROOTS for path in root.rglob("*.yaml")
                 if not path.name.startswith("bench_") and "hydra" not in path.parts
                 and "debug" not in path.parts)
GLOBAL = "# @package _global_"


def _schema_of(kind) -> type | None:
    """The dataclass a field's type names (X | None: X), if it is one."""
    for candidate in (kind, *typing.get_args(kind)):
        if dataclasses.is_dataclass(candidate):
            return candidate
    return None


def _fields(schema: type) -> dict[str, tuple[dataclasses.Field, type]]:
    hints = typing.get_type_hints(schema)
    return {spec.name: (spec, hints[spec.name]) for spec in dataclasses.fields(schema)}


def schema_default(path: list[str]):
    """(True, the default) of the schema field at `path` from the root (a group's node by its
    group's schema), or (False, None) where no schema gives the key a default."""
    schema: type | None = config_schema.RunSchema
    if path[0] in config_schema.GROUPS:
        schema, path = config_schema.GROUPS[path[0]], path[1:]
    for depth, name in enumerate(path):
        found = _fields(schema).get(name) if schema is not None else None
        if found is None:
            return False, None
        spec, kind = found
        if depth == len(path) - 1:
            if spec.default is not dataclasses.MISSING:
                return spec.default is not MISSING, spec.default
            if spec.default_factory is not dataclasses.MISSING:
                return True, spec.default_factory()
            return False, None
        schema = _schema_of(kind)
    return False, None


def _leaves(node, path: list[str]):
    if isinstance(node, DictConfig) and len(node) > 0:
        for key in node.keys():
            yield from _leaves(node._get_node(key), [*path, str(key)])
    else:
        yield path, node


def _same(value, default) -> bool:
    """Equal as a config holds them: true is not 1, 2 is 2.0."""
    if isinstance(value, bool) != isinstance(default, bool):
        return False
    return value == default


def _is_global(path: Path) -> bool:
    return path.read_text().startswith(GLOBAL) or path.name == "config.yaml"


def _layer(path: Path) -> int:
    """Which presets a preset sits on: a group's (0) on its schema, a recipe or a sweep (1) on
    the groups' presets, an experiment (2) on a recipe too."""
    if not _is_global(path) or path.name == "config.yaml":
        return 0
    return 2 if path.parent.name == "experiment" else 1


def _values(path: Path) -> dict[str, object]:
    """key path -> value of every leaf the file sets, as the whole config names it."""
    raw = OmegaConf.load(path)
    base = [] if _is_global(path) else [path.parent.name]
    found = {}
    for key in raw.keys():
        if key in ("defaults", "hydra"):
            continue
        for leaf, node in _leaves(raw._get_node(key), [*base, str(key)]):
            value = OmegaConf.to_container(node) if OmegaConf.is_config(node) else node._value()
            found[".".join(leaf)] = value
    return found


def restated_defaults(path: Path, others: list[Path] = PRESETS) -> list[str]:
    """`key: value` of each value in the file that its schema's default already is (in a
    preset of the whole config: and that no other preset sets otherwise)."""
    elsewhere = set()
    if _is_global(path):
        elsewhere = {key for other in others if _layer(other) < _layer(path)
                     for key in _values(other)}
    found = []
    for key, value in _values(path).items():
        has_default, default = schema_default(key.split("."))
        if has_default and _same(value, default) and key not in elsewhere:
            found.append(f"{key}: {value!r}")
    return found


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.relative_to(p.parents[1]).as_posix())
def test_a_preset_sets_no_value_its_schema_defaults_to(path):
    assert restated_defaults(path) == [], f"{path}: the schema's defaults, restated"


def test_a_restated_default_is_caught(tmp_path):
    """What the check does the day a preset restates a default: the key is named."""
    preset = tmp_path / "model" / "restated.yaml"
    preset.parent.mkdir()
    preset.write_text("name_or_path: bert-base-uncased\nhidden_dropout_prob: 0.1\n"
                      "feature_based:\n  lstm_layers: 2\n  lstm_hidden_size: 512\n")
    assert restated_defaults(preset) == ["model.hidden_dropout_prob: 0.1",
                                         "model.feature_based.lstm_layers: 2"]
    recipe = tmp_path / "recipe" / "restated.yaml"
    recipe.parent.mkdir()
    recipe.write_text(f"{GLOBAL}\nseed: 42\nbucket_width: 8\nbudget:\n  decay: linear\n"
                      "finetuning:\n  lora:\n    r: 8\n")
    assert restated_defaults(recipe) == ["seed: 42", "budget.decay: 'linear'",
                                         "finetuning.lora.r: 8"]


def test_every_group_schema_is_the_base_of_its_group():
    """conf/config.yaml (or the recipe that adds the group) lists /<group>_schema@<group>
    before the group's choice, or the group's presets list it (the trainer's), so that a key
    a preset leaves out gets the schema's default."""
    for group in config_schema.GROUPS:
        listed = [path for path in [Path(config_dir()) / "config.yaml", *PRESETS]
                  if f"/{group}_schema@" in path.read_text()]
        assert listed, group
