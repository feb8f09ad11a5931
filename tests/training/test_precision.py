"""mixed_precision=auto picks what the device can run, and an explicit GPU precision without a
GPU is refused by name: the GPU-only path selected and the CPU fallback, on this CPU."""

from __future__ import annotations

import pytest

from bertkit.errors import BertkitError
from bertkit.training import arguments
from bertkit.training.arguments import resolve_mixed_precision


@pytest.mark.parametrize(("gpu", "bf16", "expected"), [
    (False, False, "no"), (True, True, "bf16"), (True, False, "fp16")])
def test_auto_follows_the_device(monkeypatch, gpu, bf16, expected):
    monkeypatch.setattr(arguments.torch.cuda, "is_available", lambda: gpu)
    monkeypatch.setattr(arguments.torch.cuda, "is_bf16_supported", lambda: bf16)
    assert resolve_mixed_precision("auto") == expected


def test_explicit_choices(monkeypatch):
    assert resolve_mixed_precision("no") == "no"
    with pytest.raises(BertkitError, match="mixed_precision=bf16: needs a GPU"):
        resolve_mixed_precision("bf16")
    with pytest.raises(BertkitError, match=r"mixed_precision='fp8': expected one of auto"):
        resolve_mixed_precision("fp8")
    monkeypatch.setattr(arguments.torch.cuda, "is_available", lambda: True)
    assert resolve_mixed_precision("fp16") == "fp16"
