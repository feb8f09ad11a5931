"""A multirun's launcher and sweeper parameters are checked by bertkit before Hydra
instantiates them (issue 60, item 6): every parameter of every launcher and sweeper bertkit's
presets pick (conf/hydra/launcher/, conf/sweep/, and Hydra's default basic ones), read from the
plugin's own dataclass, refuses a value of the wrong type and, where bounded, one out of range
in one line naming the key. `hydra.launcher.jobs_per_gpu=0` used to end in Hydra's four lines
("Error in call to target ...GpuPackLauncher", "full_key: hydra.launcher"), exit 1."""

from __future__ import annotations

import copy
import functools
import sys
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, ListConfig, OmegaConf

from bertkit import cli
from bertkit.config_schema import (
    LAUNCH_NODES,
    _type_names,
    check_launch,
    choices_of,
    numeric_bounds,
    plugin_fields,
)
from bertkit.config_tree import config_dir
from bertkit.errors import BertkitError
from tests.conftest import compose_config

CONF = Path(config_dir())
NOT_A_CHOICE = "no_such_choice"


def presets() -> list[str]:
    """Hydra's default launcher and sweeper (no override), each launcher preset and each sweep
    preset bertkit ships."""
    return ["", *(f"hydra/launcher={path.stem}"
                  for path in sorted((CONF / "hydra" / "launcher").glob("*.yaml"))),
            *(f"sweep={path.stem}" for path in sorted((CONF / "sweep").glob("*.yaml")))]


@functools.cache
def composed(preset: str) -> DictConfig:
    return compose_config(["recipe=glue", *preset.split()], with_hydra=True)


@functools.cache
def parameters() -> dict[str, tuple]:
    """"<preset> <key>" -> (preset, key, field, bounds): each parameter of each plugin once (the
    first preset that picks it; the grids all run on the basic sweeper)."""
    found, seen = {}, set()
    for preset in presets():
        cfg = composed(preset)
        for path in LAUNCH_NODES:
            for key, spec, bounds, _ in plugin_fields(OmegaConf.select(cfg, path), path):
                if key.endswith("._target_") or (key, id(spec)) in seen:
                    continue
                seen.add((key, id(spec)))
                found[f"{preset or 'default'} {key}"] = (preset, key, spec, bounds)
    return found


def _leaves(node: DictConfig, prefix: str):
    for key in node.keys():
        path = f"{prefix}.{key}"
        value = node.get(key)
        if isinstance(value, DictConfig) and OmegaConf.get_type(value) is not dict:
            yield from _leaves(value, path)
        elif not path.endswith("._target_"):
            yield path


def _numeric(spec) -> bool:
    return bool({"int", "float"} & set(_type_names(spec)))


def test_every_preset_passes_and_every_parameter_is_described():
    """Each preset's own values pass; every key the composed launcher or sweeper holds is a
    field of its plugin's dataclass (so none escapes the check), and every number declares
    both ends of its range (None: a side without a limit)."""
    for preset in presets():
        cfg = composed(preset)
        check_launch(cfg)
        for path in LAUNCH_NODES:
            node = OmegaConf.select(cfg, path)
            described = {key for key, *_ in plugin_fields(node, path)}
            assert set(_leaves(node, path)) <= described, preset
    unbounded = [name for name, (_, _, spec, bounds) in parameters().items()
                 if _numeric(spec) and not ({"min", "above"} & bounds.keys()
                                            and {"max", "below"} & bounds.keys())]
    assert not unbounded, unbounded
    keys = {key for _, key, _, _ in parameters().values()}
    assert {"hydra.launcher.jobs_per_gpu", "hydra.launcher.memory.bytes_per_parameter",
            "hydra.launcher.n_jobs", "hydra.launcher.timeout_min", "hydra.sweeper.eta",
            "hydra.sweeper.n_trials", "hydra.sweeper.sampler.seed",
            "hydra.sweeper.max_batch_size"} <= keys  # the walk reached every plugin


def wrong_type(spec) -> str | None:
    """A command-line value OmegaConf refuses for the field; None where every value is of
    its type (Any)."""
    names = set(_type_names(spec)) - {"None"}
    if names & {"int", "float", "bool", "list", "dict"}:
        return "abc"
    return "[a]" if names == {"str"} else None


@pytest.mark.parametrize("name", sorted(name for name, (_, _, spec, _) in parameters().items()
                                        if wrong_type(spec) is not None))
def test_a_value_of_the_wrong_type_is_refused_in_one_line_naming_the_key(name):
    preset, key, spec, _ = parameters()[name]
    value = wrong_type(spec)
    with pytest.raises(ConfigCompositionException) as error:
        compose_config(["recipe=glue", *preset.split(), f"{key}={value}"], with_hydra=True)
    message = cli.composition_message(error.value)
    assert message is not None and "\n" not in message, message
    shown = "['a']" if value == "[a]" else repr(value)  # as OmegaConf parsed it
    assert message.startswith(f"{key}={shown}: expected "), message


def out_of_range(bounds: dict) -> list:
    """Values just past each declared end, and a word not among the choices."""
    numeric = {key: bound for key, bound in numeric_bounds(bounds).items() if bound is not None}
    values = [numeric[key] + step for key, step in (("min", -1), ("above", 0), ("max", 1),
                                                     ("below", 0)) if key in numeric]
    if choices_of(bounds) is not None and not numeric:
        values.append(NOT_A_CHOICE)
    return values


@pytest.mark.parametrize("name", sorted(name for name, (*_, bounds) in parameters().items()
                                        if out_of_range(bounds)))
def test_a_value_out_of_range_is_refused_in_one_line_naming_the_key(name):
    preset, key, _, bounds = parameters()[name]
    for value in out_of_range(bounds):
        cfg = copy.deepcopy(composed(preset))
        OmegaConf.set_readonly(cfg, False)
        held = OmegaConf.select(cfg, key)
        given = ({"x": value} if isinstance(held, DictConfig)
                 else [value] if isinstance(held, ListConfig) or bounds.get("each") else value)
        OmegaConf.update(cfg, key, given, merge=False)
        with pytest.raises(BertkitError) as error:
            check_launch(cfg)
        message = str(error.value)
        assert "\n" not in message, message
        assert message.startswith((f"{key}=", f"{key}[0]=", f"{key}.x=")), message
        assert "expected" in message, message


# --- through the command: one line, exit status 2, before any job ----------------------------

@pytest.mark.parametrize(("overrides", "line"), [
    (["hydra/launcher=gpu_pack", "hydra.launcher.jobs_per_gpu=0"],
     "bertkit: error: hydra.launcher.jobs_per_gpu=0: expected a number of jobs sharing one GPU, "
     "1 or more"),
    (["sweep=paper_grid_halving", "hydra.sweeper.eta=1"],
     "bertkit: error: hydra.sweeper.eta=1.0: expected a number above 1 (the best 1/eta of the "
     "configurations go on after each rung)"),
])
def test_the_command_refuses_a_launch_setting_in_one_line(overrides, line, tmp_path,
                                                          monkeypatch, capsys):
    sweep_dir = tmp_path / "sweep"
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setattr(sys, "argv", ["bertkit", "-m", "recipe=demo", "logger=none",
                                      f"hydra.sweep.dir={sweep_dir}", *overrides])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [line]
    assert not sweep_dir.exists()
