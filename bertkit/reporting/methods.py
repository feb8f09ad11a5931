"""A run's finetuning method as the report names its system: the preset (finetuning.name) and
the settings in which the run differs from that preset. A sweep over
finetuning.layer_lr_decay=1.0,0.95,0.9 (or an Optuna study over it) is then one system per
value, never one row that averages different methods as if they were seeds."""

from __future__ import annotations

from functools import cache

from hydra.errors import HydraException
from omegaconf import OmegaConf

from bertkit.config_tree import compose_config
from bertkit.finetuning.settings import describe


def _flat(node: object, prefix: str = "") -> dict[str, object]:
    if not isinstance(node, dict):
        return {prefix: node}
    flat: dict[str, object] = {}
    for key, value in node.items():
        flat.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


@cache
def _preset(name: str) -> dict[str, object]:
    """conf/finetuning/<name>.yaml as metrics.json records it; {} for a name that is no
    preset of this bertkit (a user's own, or a renamed one): then every setting is shown."""
    try:
        settings = compose_config([f"finetuning={name}"]).finetuning
    except HydraException:
        return {}
    return _flat(describe(settings))


def _value(value: object) -> str:
    return OmegaConf.to_yaml(value).strip() if isinstance(value, (list, dict)) else str(value)


def finetuning_method(settings: object) -> str:
    """"" for plain full finetuning (and runs from before finetuning.* existed); "llrd" for
    a preset as it ships; "llrd[layer_lr_decay=0.9]" for a preset with a setting changed."""
    if not isinstance(settings, dict):
        return ""
    name = str(settings.get("name") or "full")
    preset = _preset(name)
    changed = [f"{key}={_value(value)}" for key, value in _flat(settings).items()
               if key != "name" and (key not in preset or preset[key] != value)]
    if not changed:
        return "" if name == "full" else name
    return f"{name}[{', '.join(changed)}]"
