"""The benchmarks' own settings (bench.*, parity.*, bench_sweep.*, bench_grid.*), held to
their ranges as bertkit holds its own (bertkit.config_schema: a range written as an interval,
one line naming the key): checked at each benchmark's entry, before anything is read."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from omegaconf import DictConfig

from bertkit.config_schema import (
    COUNT,
    LEARNING_RATE,
    PROBABILITY,
    SEED,
    BertConfigSchema,
    _check_node,
    _out_of_range,
    _refuse,
    _setting,
    nodes,
)


@dataclass
class BenchSchema:
    """bench.* of the benchmark recipes."""

    steps: int = _setting(COUNT)
    warmup_steps: int = _setting("[0, inf)")
    steady_skip: int = _setting("[0, inf)")
    repeats: int = _setting(COUNT)
    sync_steps: int = _setting("[2, inf)", "at least 2 (the last step logs, and is not counted)")
    batch_size: int = _setting(COUNT)
    baseline_max_length: int = _setting("[3, inf)")
    eval_instances: int = _setting(COUNT)
    instances: int = _setting(COUNT)  # bench_masking
    mlm_probability: float = _setting("(0, 1)")
    num_proc: int | None = _setting(COUNT)  # null: in the main process
    num_threads: int | None = _setting(COUNT)


@dataclass
class BenchWorkloadSchema:
    """bench.glue, bench.pretraining and bench.pretraining_packed (bench_step's synthetic
    batches)."""

    batch_size: int = _setting(COUNT)
    batches: int = _setting(COUNT)
    seq_length: int = _setting("[3, inf)")
    min_length: int = _setting("[3, inf)")
    padded_share: float = _setting(PROBABILITY)
    num_labels: int = _setting(COUNT)
    mlm_slots: int = _setting(COUNT)
    mlm_used: int = _setting(COUNT)
    # pretraining_packed's: pretraining.sequence_slot_headroom's bounds
    sequence_slot_headroom: float = _setting("[1, inf)")


@dataclass
class BenchPlainSchema:
    """bench.plain: the plain Hugging Face pretraining bench_pretrain_quality compares with."""

    batch_size: int = _setting(COUNT)
    warmup_ratio: float = _setting(PROBABILITY)
    weight_decay: float = _setting("[0, inf)")
    dropout: float = _setting(PROBABILITY)
    mlm_probability: float = _setting("(0, 1)")
    timing_steps: int = _setting(COUNT)
    learning_rates: list[float] = _setting(LEARNING_RATE, each=True)
    logging_steps: int = _setting(COUNT)


@dataclass
class ParitySchema:
    baseline_max_length: int = _setting("[3, inf)")
    alpha: float = _setting("(0, 1)")
    max_difference: float = _setting("[0, inf)")
    seeds: list[int] = _setting(SEED, "seeds in [0, 2**32 - 1]", each=True)


@dataclass
class BenchSweepSchema:
    n_jobs: int = _setting(COUNT)
    seeds: list[int] = _setting(SEED, "seeds in [0, 2**32 - 1]", each=True)


@dataclass
class BenchGridSchema:
    learning_rates: list[float] = _setting(LEARNING_RATE, each=True)
    seeds: list[int] = _setting(SEED, "seeds in [0, 2**32 - 1]", each=True)
    # plain or bench_grid.launchers' names (glue_grid checks which)
    ways: list[str] = _setting()
    jobs_per_gpu: int = _setting(COUNT)
    baseline_max_length: int = _setting("[3, inf)")


# node -> the schema of the keys it must hold to; checked, not composed.
SETTINGS = {
    "bench": BenchSchema, "bench.model": BertConfigSchema, "bench.glue": BenchWorkloadSchema,
    "bench.pretraining": BenchWorkloadSchema, "bench.pretraining_packed": BenchWorkloadSchema,
    "bench.plain": BenchPlainSchema, "parity": ParitySchema, "bench_sweep": BenchSweepSchema,
    "bench_grid": BenchGridSchema}


def check_settings(cfg: DictConfig) -> None:
    """The benchmark nodes of cfg held to their schemas (bertkit's own nodes are run_job's)."""
    for path, schema in SETTINGS.items():
        for at, node in nodes(cfg, path):
            _check_node(at, node, schema, typed=False)


def check_setting(key: str, value) -> None:
    """One benchmark value held to its field's range, in check_settings' one line: for a
    direct call that is handed the value itself."""
    path, _, name = key.rpartition(".")
    spec = next(s for s in dataclasses.fields(SETTINGS[path]) if s.name == name)
    problem = _out_of_range(value, spec.metadata)
    if problem:
        _refuse(f"{key}={value!r}", spec, problem)
