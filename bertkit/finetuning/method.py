"""A finetuning method as one registry entry (as MosaicML's algorithm registry): a Method
subclass in its own module of bertkit/finetuning/methods/, named in its METHODS table
(bertkit.registry), and a preset conf/finetuning/<name>.yaml that turns it on. ActiveMethods
(bertkit.finetuning.active_methods) runs every method the `finetuning` node turns on, in `order`.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from omegaconf import DictConfig
from torch import nn

from bertkit.errors import BertkitError
from bertkit.registry import imported


class Method:
    """What one method does at each point of a finetune. A fresh instance per run holds that
    run's state (hooks, callbacks, what it learned); the class methods read settings alone."""

    # apply() runs in this order: a re-initialised layer before LoRA wraps it, the scalar
    # mix before freezing decides what trains, LoRA last.
    order: int = 50

    def __init__(self, settings: DictConfig):
        self.settings = settings

    @classmethod
    def active(cls, settings: DictConfig) -> bool:
        """Whether the node turns the method on (every method off: plain full finetuning)."""
        raise NotImplementedError

    @classmethod
    def check(cls, settings: DictConfig, num_layers: int | None = None) -> None:
        """The rules between its keys and others, on or off, refused before any data is read
        (each key's own type and range is the schema's, bertkit.config_schema); num_layers
        (the model's, once known) bounds layer counts."""

    @classmethod
    def describe(cls, plain: dict) -> None:
        """Trims its keys in metrics.json's record of the node (e.g. an off method's options)."""

    def apply(self, model: nn.Module) -> nn.Module:
        """The model with the method applied, before the Trainer is built."""
        return model

    def needs_layer_groups(self) -> bool:
        """The optimizer must hold one group per depth (embeddings, layer_i, head)."""
        return False

    def trains_later(self, name: str) -> bool:
        """A parameter frozen now that the method trains later: in the optimizer from the start."""
        return False

    def log_callbacks(self) -> list:
        """Callbacks that add keys to each training log: put before the reporting ones."""
        return []

    def callbacks(self, trainer) -> list:
        """Callbacks of its behaviour during training."""
        return []

    def finish(self, trainer, run_dir: Path, main: bool) -> None:
        """After training, before the final evaluation."""

    def record(self) -> dict:
        """What it did or learned, for metrics.json's details.finetuning and W&B."""
        return {}


_REGISTRY: dict[str, type[Method]] = {}


def register(cls: type[Method]) -> type[Method]:
    """Class decorator of a method module: the class is its registry entry, by module name."""
    name = cls.__module__.rsplit(".", 1)[-1]
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise BertkitError(f"finetuning method {name} is registered twice "
                           f"({_REGISTRY[name].__qualname__} and {cls.__qualname__})")
    _REGISTRY[name] = cls
    return cls


@cache
def registered() -> tuple[type[Method], ...]:
    """Every method of METHODS (bertkit/finetuning/methods/), in apply() order."""
    from bertkit.finetuning.methods import METHODS

    for entry in METHODS.values():
        imported(entry)  # its @register enters it
    return tuple(sorted(_REGISTRY.values(), key=lambda cls: (cls.order, cls.__module__)))
