"""Hydra finds sweepers in the hydra_plugins namespace package: this one is bertkit's
successive halving (hydra/sweeper=bertkit_halving, used by sweep=paper_grid_halving)."""
