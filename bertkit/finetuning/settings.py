"""The `finetuning` config node, checked at the edge (one message naming the key) before any
data is read, and described by plain names for metrics.json and the W&B config."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from bertkit.errors import BertkitError

POOLING = ("cls", "mean")
NOISE = ("normal", "uniform")


def _count(settings: DictConfig, key: str) -> int:
    value = settings[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BertkitError(f"finetuning.{key}={value!r}: expected a whole number >= 0")
    return value


def _positive(value, key: str, upper: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
            or (upper is not None and value > upper):
        bound = f" and <= {upper}" if upper is not None else ""
        raise BertkitError(f"finetuning.{key}={value!r}: expected a number > 0{bound}")
    return float(value)


def unfreeze_every(settings: DictConfig) -> int | str | None:
    value = settings.unfreeze_every
    if value is None or value == "epoch":
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BertkitError(f"finetuning.unfreeze_every={value!r}: expected epoch, a number of "
                           f"optimizer steps >= 1, or null (off)")
    return value


def check_settings(settings: DictConfig, num_layers: int | None = None) -> None:
    """Every key of the node; num_layers (the model's, once known) bounds the layer counts."""
    frozen, reinit = _count(settings, "freeze_layers"), _count(settings, "reinit_layers")
    _positive(settings.layer_lr_decay, "layer_lr_decay", upper=1.0)
    _positive(settings.head_lr_multiplier, "head_lr_multiplier")
    unfreeze_every(settings)
    if settings.pooling not in POOLING:
        raise BertkitError(f"finetuning.pooling={settings.pooling!r}: expected one of "
                           f"{', '.join(POOLING)}")
    r3f = settings.r3f
    if isinstance(r3f.weight, bool) or not isinstance(r3f.weight, (int, float)) \
            or r3f.weight < 0:
        raise BertkitError(f"finetuning.r3f.weight={r3f.weight!r}: expected a number >= 0 "
                           f"(0: off)")
    if r3f.weight > 0:
        _positive(r3f.eps, "r3f.eps")
        if r3f.noise not in NOISE:
            raise BertkitError(f"finetuning.r3f.noise={r3f.noise!r}: expected one of "
                               f"{', '.join(NOISE)}")
    if settings.lora.enabled and (frozen or settings.freeze_embeddings
                                  or settings.unfreeze_every is not None):
        raise BertkitError("finetuning.lora.enabled=true trains only the adapters and the head: "
                           "it does not combine with finetuning.freeze_embeddings, "
                           "finetuning.freeze_layers or finetuning.unfreeze_every")
    if settings.unfreeze_every is not None and (frozen or settings.freeze_embeddings):
        raise BertkitError("finetuning.unfreeze_every unfreezes every layer in turn: it does not "
                           "combine with finetuning.freeze_embeddings or finetuning.freeze_layers")
    if num_layers is not None:
        for key, value in (("freeze_layers", frozen), ("reinit_layers", reinit)):
            if value > num_layers:
                raise BertkitError(f"finetuning.{key}={value}: the model has only "
                                   f"{num_layers} encoder layers")


def is_plain(settings: DictConfig) -> bool:
    """Nothing on: the run is the paper's full finetuning, through Trainer's own optimizer."""
    return (not settings.freeze_embeddings and settings.freeze_layers == 0
            and settings.layer_lr_decay == 1.0 and settings.head_lr_multiplier == 1.0
            and settings.unfreeze_every is None and settings.reinit_layers == 0
            and not settings.layer_mix and settings.pooling == "cls"
            and not settings.lora.enabled and settings.r3f.weight == 0)


def describe(settings: DictConfig) -> dict:
    """The node by plain names (metrics.json "finetuning", W&B config finetuning.*)."""
    plain = OmegaConf.to_container(settings, resolve=True)
    if not plain["lora"]["enabled"]:
        plain["lora"] = {"enabled": False}
    if plain["intermediate"]["task"] is None:
        plain["intermediate"] = {"task": None}
    return plain
