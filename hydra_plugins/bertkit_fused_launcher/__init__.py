"""Hydra finds launchers in the hydra_plugins namespace package: this one trains the finetunes
of a multirun that share their shapes as one model array (hydra/launcher=fused)."""
