"""Every number a user can type is bounded at the edge (bertkit.config_schema), generated from
the composed configs and the schema, so that a key added tomorrow is covered the day it is:

- every numeric key of every composed config (each recipe, experiment preset (protocols too),
  and each option of each config group) declares both ends of its range in the schema (None
  for a side that is genuinely unbounded): a key with no declared bound fails here;
- each such key set to boundary values (0, -1, a huge number, a fraction, a word), and each
  enumerated key to a word not in its list, is either accepted or refused before the job
  starts with one line that names the key: a BertkitError from check_ranges, or, for the
  ConfigStore-typed nodes (the root, trainer, model, ...), Hydra's composition error as
  bertkit's one line.
"""

from __future__ import annotations

import copy
import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, ListConfig, OmegaConf, ValidationError

from bertkit.cli import composition_message
from bertkit.config_paths import recipes_dir
from bertkit.config_schema import (
    SCHEMAS,
    _out_of_range,
    check_ranges,
    choices_of,
    numeric_bounds,
    schema_field,
)
from bertkit.config_tree import config_dir
from bertkit.errors import BertkitError
from tests.conftest import compose_config

CONF = Path(config_dir())
BOUNDARY_VALUES = (0, -1, 10**30, 0.5, "abc")
NOT_A_CHOICE = "no_such_choice"


def _options(group: str) -> list[str]:
    """A group's options, in conf/ or (recipe, experiment) in recipes/."""
    return sorted(path.stem for root in (CONF, Path(recipes_dir()))
                  for path in (root / group).glob("*.yaml"))


@functools.cache
def selections() -> dict[str, DictConfig]:
    """Each recipe and preset (the calibrated protocols among them), and each option of every
    other config group on the first recipe that has that group (corpus, masking and objective
    are pretraining's)."""
    picked = ([f"recipe={name}" for name in _options("recipe")]
              + [f"experiment={name}" for name in _options("experiment")])
    configs = {selection: compose_config(selection.split()) for selection in picked}
    skip = {"sweep", "hydra"}
    for group in sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name not in skip):
        base = next((s for s, cfg in configs.items() if group in cfg), None)
        if base is None:
            continue
        for option in _options(group):
            selection = f"{base} {group}={option}"
            configs.setdefault(selection, compose_config(selection.split()))
    return configs


def _leaves(node: DictConfig, prefix: str = "", lists: bool = False):
    for key in node.keys():
        path = f"{prefix}.{key}" if prefix else str(key)
        value = node.get(key)
        if isinstance(value, DictConfig):
            yield from _leaves(value, path, lists)
        elif lists or not isinstance(value, ListConfig):
            yield path, value


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_numbers(value) -> bool:
    """A non-empty list of numbers (parity.seeds): its items are bounded one by one."""
    return isinstance(value, ListConfig) and len(value) > 0 and all(map(_is_number, value))


@functools.cache
def numeric_keys() -> dict[str, str]:
    """Every numeric key (a number or a list of numbers) of the composed configs -> the first
    selection that has it."""
    keys = {}
    for selection, cfg in selections().items():
        for key, value in _leaves(cfg, lists=True):
            if (_is_number(value) or _is_numbers(value)) and not key.startswith("hydra."):
                keys.setdefault(key, selection)
    return keys


@functools.cache
def enumerated_keys() -> dict[str, str]:
    """Every key the schema gives choices, as it appears in a composed config."""
    keys = {}
    for selection, cfg in selections().items():
        for key, value in _leaves(cfg):
            spec = schema_field(key)
            if spec is not None and "choices" in spec.metadata and isinstance(value, str):
                keys.setdefault(key, selection)
    return keys


def _typed(key: str) -> bool:
    """A key of a node OmegaConf types as Hydra composes (the root, the trainer, model, ...
    groups: SCHEMAS): a wrong type is refused then, so the wrong-typed value goes through
    Hydra's override."""
    return key.rpartition(".")[0] in SCHEMAS


def undeclared(keys: dict[str, str]) -> list[str]:
    """The keys (-> where they were found) whose schema field does not declare both ends of
    its range (None for a side said to be unbounded), or that no schema knows."""
    missing = []
    for key, selection in sorted(keys.items()):
        spec = schema_field(key)
        bounds = numeric_bounds(dict(spec.metadata)) if spec is not None else {}
        if not ({"min", "above"} & bounds.keys() and {"max", "below"} & bounds.keys()):
            missing.append(f"{key} ({selection})")
    return missing


def test_every_numeric_key_declares_its_bounds():
    """A key whose range nobody declared (or one the schema does not know at all) fails here,
    naming it."""
    missing = undeclared(numeric_keys())
    assert not missing, "numeric keys without both bounds in bertkit.config_schema: " \
        + ", ".join(missing)
    assert len(numeric_keys()) > 140  # the walk reached the groups (149 once the benchmarks left)


def test_a_numeric_key_added_without_bounds_is_caught():
    """What the walk does the day a YAML adds a number: the key is named."""
    cfg = compose_config(["recipe=glue", "+task.new_knob=3", "+finetuning.lora.new_rate=0.5"])
    keys = {key: "test" for key, value in _leaves(cfg) if _is_number(value)}
    assert undeclared(keys) == ["finetuning.lora.new_rate (test)", "task.new_knob (test)"]


def _refusal(key: str, value, selection: str) -> str | None:
    """The one line that refuses key=value at the edge, or None when it is accepted."""
    if _typed(key) and isinstance(value, str):
        override = f"{key}={value}"
        try:
            cfg = compose_config(selection.split() + [override])
        except ConfigCompositionException as err:
            message = composition_message(err)
            assert message is not None, f"{override}: Hydra's message {err}"
            return message
    else:
        cfg = copy.deepcopy(selections()[selection])
        if _is_numbers(OmegaConf.select(cfg, key)):
            value = [value]  # a list's items are what is bounded
        try:
            OmegaConf.update(cfg, key, value, merge=False)
        except ValidationError:  # a typed group's int refuses 0.5 as Hydra's override would
            assert _typed(key), key
            return _refusal(key, str(value), selection)
    try:
        check_ranges(cfg)
    except BertkitError as err:
        return str(err)
    stored = OmegaConf.select(cfg, key)  # a typed float field holds 10**30 as 1e30
    for item in stored if isinstance(stored, ListConfig) else [stored]:
        assert _out_of_range(item, dict(schema_field(key).metadata)) is None, \
            f"{key}={value!r} accepted as {stored!r}"
    return None


def _assert_one_line_naming(key: str, value, message: str | None) -> None:
    spec = schema_field(key)
    if message is None:  # accepted (_refusal checked the stored value): a number or a choice
        assert _is_number(value) or "choices" in spec.metadata, f"{key}={value!r} accepted"
        return
    assert "\n" not in message, message
    assert message.startswith((f"{key}=", f"{key}[0]=")), message


@pytest.mark.parametrize("key", sorted(numeric_keys()))
def test_a_numeric_key_at_its_boundaries_is_accepted_or_refused_in_one_line(key):
    selection = numeric_keys()[key]
    for value in BOUNDARY_VALUES:
        _assert_one_line_naming(key, value, _refusal(key, value, selection))


@pytest.mark.parametrize("key", sorted(enumerated_keys()))
def test_an_enumerated_key_refuses_a_word_not_in_its_list_in_one_line(key):
    message = _refusal(key, NOT_A_CHOICE, enumerated_keys()[key])
    assert message is not None, f"{key}={NOT_A_CHOICE} accepted"
    _assert_one_line_naming(key, NOT_A_CHOICE, message)
    assert str(choices_of(dict(schema_field(key).metadata))[0]) in message  # lists the choices


@pytest.mark.slow
def test_the_command_prints_a_composition_error_in_one_line_naming_the_key(tmp_path):
    """Through `python -m bertkit`: a value OmegaConf refuses while Hydra composes (the typed
    trainer group) is bertkit's one line, exit status 2, as a value check_ranges refuses
    (seed=-1, which ended in numpy's traceback: tests/test_config_schema.py)."""
    override = "trainer.learning_rate=fast"
    message = "trainer.learning_rate='fast': expected a number"
    env = {**os.environ, "PYTHONPATH": str(CONF.parent), "WANDB_MODE": "disabled"}
    done = subprocess.run([sys.executable, "-m", "bertkit", override, "logger=none",
                           f"hydra.run.dir={tmp_path / 'run'}"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [f"bertkit: error: {message}"]
    assert not (tmp_path / "run" / "metrics.json").exists()
