"""The `finetuning` node's layer counts against the model's depth, known once it is loaded;
each key's own type and range is the schema's (bertkit.config_schema.FinetuningSchema)."""

from __future__ import annotations

from bertkit.errors import BertkitError


def within_layers(key: str, value: int, num_layers: int | None) -> None:
    if num_layers is not None and value > num_layers:
        raise BertkitError(f"finetuning.{key}={value}: the model has only {num_layers} "
                           f"encoder layers")
