"""Type and range checks of the `finetuning` node's keys, one message naming the key."""

from __future__ import annotations

from omegaconf import DictConfig

from bertkit.errors import BertkitError


def whole_number(settings: DictConfig, key: str) -> int:
    value = settings[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BertkitError(f"finetuning.{key}={value!r}: expected a whole number >= 0")
    return value


def positive(value, key: str, upper: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
            or (upper is not None and value > upper):
        bound = f" and <= {upper}" if upper is not None else ""
        raise BertkitError(f"finetuning.{key}={value!r}: expected a number > 0{bound}")
    return float(value)


def flag(settings: DictConfig, key: str) -> bool:
    """A switch that may be absent from the node (a method added with its own preset)."""
    value = settings.get(key, False)
    if not isinstance(value, bool):
        raise BertkitError(f"finetuning.{key}={value!r}: expected true or false")
    return value


def within_layers(key: str, value: int, num_layers: int | None) -> None:
    if num_layers is not None and value > num_layers:
        raise BertkitError(f"finetuning.{key}={value}: the model has only {num_layers} "
                           f"encoder layers")
