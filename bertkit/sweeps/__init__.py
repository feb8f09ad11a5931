"""Sweeps beyond Hydra's grid: successive halving's rungs and survivor choice (the Hydra
sweeper plugin in hydra_plugins/ drives it). Imports `bertkit.data` only."""
