"""A sweep job's configuration, read from its Hydra overrides: what successive halving ranks
over seeds (bertkit.sweeps.halving) and what a multirun's W&B runs are grouped by
(bertkit.training.wandb_logging). In `data` because both subpackages may import it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

Overrides = tuple[str, ...]


def override_key(override: str) -> str:
    """trainer.learning_rate of "trainer.learning_rate=2e-5" (and of "+x=1" / "++x=1")."""
    return override.split("=", 1)[0].lstrip("+~")


def short_key(key: str, keys: Sequence[str]) -> str:
    """The shortest dotted suffix of key that no other of keys ends with: how a W&B run name
    and a report row name a setting (learning_rate for trainer.learning_rate)."""
    parts = key.split(".")
    for n in range(1, len(parts) + 1):
        suffix = ".".join(parts[-n:])
        if not any(other != key and (other == suffix or other.endswith("." + suffix))
                   for other in keys):
            return suffix
    return key


def configuration_of(overrides: Sequence[str], replicate_keys: Iterable[str]) -> Overrides:
    """A job's configuration: its overrides without the replicate keys (the seed)."""
    replicate = set(replicate_keys)
    return tuple(o for o in overrides if override_key(o) not in replicate)
