"""Hydra finds search-path plugins in the hydra_plugins namespace package: this one adds
bertkit's recipes/ (recipe=NAME, experiment=NAME) behind conf/, with no links between them."""
