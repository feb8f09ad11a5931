"""Hydra finds launchers in the hydra_plugins namespace package: this one runs several jobs of
a multirun at once on each GPU (hydra/launcher=gpu_pack, hydra.launcher.jobs_per_gpu)."""
