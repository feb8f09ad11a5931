"""Whether this machine can reach W&B as a user: a leaf module, so that runs (offline without a
key) and the report (no workspace saved without one) ask the same question."""

from __future__ import annotations

import netrc
import os


def has_wandb_credentials() -> bool:
    """WANDB_API_KEY, or the key `wandb login` wrote to ~/.netrc."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False
