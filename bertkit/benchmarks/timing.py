"""What every side-by-side benchmark needs to time a GPU honestly and name what it ran on."""

from __future__ import annotations

import torch


def synchronize() -> None:
    """Wait for queued GPU work, so that the clock read next covers it (no-op on a CPU)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def device_name() -> str:
    """The GPU's name (what the peak-FLOPs table matches), else "cpu"."""
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
