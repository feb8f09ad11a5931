"""What tells one multirun's W&B runs from another's, and one configuration from another within
it (conf/logger/wandb.yaml's resolvers, registered by the CLI).

A multirun (bertkit -m) is a sweep with an id of its own: <logger.sweep_tag or multirun>-<the
multirun directory's name>. Its runs are tagged sweep:<id>, grouped "<id> <the swept settings
without the replicate keys>" (the same configuration successive halving ranks, so W&B's grouped
lines average the seeds of one configuration and nothing else) and named "<dataset> <the swept
settings>", each key by its shortest distinct suffix: "mrpc learning_rate:2e-05 seed:1" (a
colon as in bertkit's tags: wandb-workspaces' filters read "=" in a value as an operator).
Outside a multirun every value is the single run's own (the resolver's last argument).

A job sees only its own overrides; which keys the launch sweeps is read from the sweeper's
params (sweep presets, Optuna's search space) and the launch's command line as Hydra's sweepers
record it (multirun.yaml in the sweep directory). Keys the sweepers add to a job themselves
(successive halving's train_fraction and resume) are not settings of it and stay out.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from omegaconf import OmegaConf

from bertkit.data.job_overrides import configuration_of, override_key, short_key
from bertkit.data.readback import read_yaml

MULTIRUN_RECORD = "multirun.yaml"  # written by Hydra's basic sweeper and bertkit's halving one
SWEEP_TAG_PREFIX = "sweep:"
MAX_TAG_LENGTH = 64  # W&B refuses a longer tag (wandb.sdk.wandb_settings)
# W&B's server is reported to refuse run names over 128 characters (NVIDIA-NeMo/Skills#842);
# groups are kept to it too.
MAX_NAME_LENGTH = 128
DEFAULT_KIND = "multirun"


def in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def later_job_of_multirun() -> bool:
    """A multirun's job after its first (hydra.job.num > 0): W&B's banner and closing
    summary were printed for the first; each job's own printout still says where its run
    went (bertkit.training.lifecycle.finish_wandb)."""
    return in_multirun() and int(HydraConfig.get().job.get("num") or 0) > 0


def fit(text: str, limit: int) -> str:
    """text, or its start and a digest of the whole when longer than limit (still unique)."""
    if len(text) <= limit:
        return text
    digest = hashlib.sha1(text.encode()).hexdigest()[:8]
    return f"{text[:limit - len(digest) - 1]}-{digest}"


def sweep_id(kind: str | None) -> str | None:
    """The launch's id (None outside a multirun): what every job of it shares, so that a W&B
    filter on sweep:<id> selects this launch and no other. The multirun directory is the
    launch's own (Hydra's default names it by its start time)."""
    if not in_multirun():
        return None
    name = Path(HydraConfig.get().sweep.dir).name
    return fit(f"{kind or DEFAULT_KIND}-{name}", MAX_TAG_LENGTH - len(SWEEP_TAG_PREFIX))


def _sweeps(lines: list[str]) -> dict[str, bool]:
    """Each key of the overrides -> whether it is swept (the last override of a key wins, as
    a command line narrows a preset's grid)."""
    parsed = OverridesParser.create().parse_overrides(lines)
    return {override_key(line): o.is_sweep_override() for line, o in zip(lines, parsed,
                                                                         strict=True)}


def swept_keys() -> set[str] | None:
    """The keys this multirun sweeps; None when neither the sweeper's params nor the launch's
    record say (another sweeper): then every override of the job counts."""
    hydra = HydraConfig.get()
    params = hydra.sweeper.get("params") or {}
    lines = [f"{key}={value}" for key, value in params.items()]
    record = Path(hydra.runtime.cwd) / hydra.sweep.dir / MULTIRUN_RECORD
    if record.is_file():
        recorded = OmegaConf.create(read_yaml(record))  # a cut record: one line naming it
        lines += [str(line) for line in recorded.hydra.overrides.task]
    elif not lines:
        return None
    return {key for key, swept in _sweeps(lines).items() if swept}


def job_settings(replicate_keys: Sequence[str] = ()) -> list[str]:
    """This job's swept settings ("key:value", keys shortened), without the replicate keys."""
    overrides = list(HydraConfig.get().overrides.task)
    swept = swept_keys()
    if swept is not None:
        overrides = [o for o in overrides if override_key(o) in swept]
    keys = [override_key(o) for o in overrides]
    return [f"{short_key(override_key(o), keys)}:{o.partition('=')[2]}"
            for o in configuration_of(overrides, replicate_keys)]


def group(sweep: str | None, replicate_keys: Sequence[str], single_run: str) -> str:
    """The W&B group: in a multirun its id and the job's configuration."""
    if sweep is None:
        return single_run
    return fit(" ".join([sweep, *job_settings(list(replicate_keys))]), MAX_NAME_LENGTH)


def name(sweep: str | None, dataset: str, single_run: str) -> str:
    """The W&B run name: in a multirun the dataset and the job's swept settings, seed too."""
    if sweep is None:
        return single_run
    return fit(" ".join([str(dataset), *job_settings()]), MAX_NAME_LENGTH)
