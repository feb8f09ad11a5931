"""A multirun job's directory, named by its swept settings (conf/config.yaml's
hydra.sweep.subdir: ${recipe.dataset}/${bertkit_job_dir:${hydra.job.num}}):
`rte/finetuning=llrd,seed=2` instead of `rte/5`, so that a reader, a glob and
bertkit-report --compare's KEY=VALUE selections address a job by what it ran.

The name is Hydra's override_dirname (the job's overrides sorted, "key=value" joined by
commas) over the keys the launch sweeps only: a setting every job shares (task.data_dir=/abs
on the command line) says nothing about one job and stays out, and so do the keys a sweeper
adds to a job itself (successive halving's train_fraction and resume, which change between
rungs while the job's directory must not) and hydra.* keys. Hydra's own override_dirname
cannot tell swept keys from the others (its exclude_keys is a fixed list), hence this
resolver; which keys are swept is read as the W&B names read it (wandb_sweep.swept_keys).

A value that would not make a safe directory name (a path: '/' would nest directories) is
shown by its last part and a digest of the whole, so two values stay two directories; a name
longer than a file name may be is cut with a digest of the whole. A job with no swept setting
(a multirun of one job), or one whose sweeper records no keys, is named by its job number,
as before.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from pathlib import PurePosixPath

from hydra.core.hydra_config import HydraConfig

from bertkit.data.job_overrides import override_key
from bertkit.training.wandb_sweep import fit, in_multirun, swept_keys

ITEM_SEPARATOR = ","  # Hydra's override_dirname defaults (hydra.job.config.override_dirname)
KEY_VALUE_SEPARATOR = "="
# The longest file name most filesystems take (ext4, XFS, APFS: 255 bytes; NAME_MAX).
NAME_MAX = 255
DIGEST_LENGTH = 8
SAFE = re.compile(r"[^A-Za-z0-9_.,=+\-\[\]]")  # anything else is replaced in a value


def job_dirname(overrides: Sequence[str], swept: Iterable[str] | None, job_num: object) -> str:
    """The directory name of one job from its overrides ("key=value" as Hydra records them)
    and the keys the launch sweeps (None: unknown, then the job number)."""
    if swept is None:
        return str(job_num)
    swept = {key for key in swept if re.split(r"[./]", key)[0] != "hydra"}
    items = sorted(f"{SAFE.sub('_', override_key(o))}{KEY_VALUE_SEPARATOR}"
                   f"{_safe(o.partition('=')[2])}"
                   for o in overrides if override_key(o) in swept)
    if not items:
        return str(job_num)
    return fit(ITEM_SEPARATOR.join(items), NAME_MAX)


def _safe(value: str) -> str:
    """value as it is when it is safe in a file name; else its last path part (cleaned) and
    a digest of the whole value, so that different values keep different names."""
    if not SAFE.search(value) and value not in (".", ".."):
        return value
    digest = hashlib.sha1(value.encode()).hexdigest()[:DIGEST_LENGTH]
    tail = SAFE.sub("_", PurePosixPath(value.rstrip("/")).name or value).strip("._")
    return f"{tail}-{digest}" if tail else digest


def job_dir(job_num: object) -> str:
    """The resolver ${bertkit_job_dir:${hydra.job.num}}: this job's directory name in a
    multirun; the job number outside one (nothing is swept)."""
    if not in_multirun():
        return str(job_num)
    return job_dirname(list(HydraConfig.get().overrides.task), swept_keys(), job_num)
