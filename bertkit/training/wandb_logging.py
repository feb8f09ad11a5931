"""Weights & Biases runs and multirun names: the run opened for Trainer's WandbCallback,
the sweep id, groups and names that tell one multirun's runs and configurations apart, and a
multirun job's directory named by its swept settings (both read which keys the launch sweeps the
same way).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import string
from collections.abc import Iterable, Sequence
from pathlib import Path, PurePosixPath

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from transformers import PreTrainedModel, TrainingArguments

from bertkit.data.atomic_files import read_json, read_yaml, write_json_atomic
from bertkit.data.job_overrides import configuration_of, override_key, short_key
from bertkit.data.metrics_file import LIMITED_SAMPLES
from bertkit.errors import BertkitError
from bertkit.secret_masking import is_secret_key, mask_secrets, masked_argv, stand_in
from bertkit.training.models import count_parameters
from bertkit.wandb_credentials import has_wandb_credentials

# ================================================================================================
# Weights & Biases runs: the resolved config, the paper's hyperparameters under plain names,
# grouping and tags for dashboards (a multirun's: wandb_sweep), offline when there are no
# credentials.
#
# Trainer's own WandbCallback logs the training curves into the run opened here.

logger = logging.getLogger(__name__)

# A run on part of the data (task.max_*_samples, corpus.max_documents, debug=smoke): tagged
# so, and grouped under its group's name with this suffix.
PARTIAL_DATA_TAG = "partial-data"
PARTIAL_GROUP_SUFFIX = "-partial"

MODES = ("auto", "online", "offline", "disabled")


def resolve_wandb_mode(setting: str) -> str:
    """WANDB_MODE in the environment wins, as W&B users expect; auto goes offline without a key."""
    if setting not in MODES:
        raise BertkitError(f"logger.mode={setting!r}: expected one of {', '.join(MODES)}")
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if setting == "auto":
        return "online" if has_wandb_credentials() else "offline"
    return setting


def paper_hyperparameters(
    args: TrainingArguments, model: PreTrainedModel, max_seq_length: int
) -> dict:
    """The knobs of Devlin et al. (2019) by plain names, so every run shows them side by side."""
    return {
        "learning_rate": args.learning_rate,
        "lr_scheduler_type": str(args.lr_scheduler_type.value
                                 if hasattr(args.lr_scheduler_type, "value")
                                 else args.lr_scheduler_type),
        # Trainer reads a warmup_steps below 1 as a share of all steps.
        "warmup_ratio": args.warmup_steps if args.warmup_steps < 1 else None,
        "warmup_steps": args.warmup_steps,
        "weight_decay": args.weight_decay,
        "adam_beta1": args.adam_beta1,
        "adam_beta2": args.adam_beta2,
        "adam_epsilon": args.adam_epsilon,
        "max_grad_norm": args.max_grad_norm,
        "hidden_dropout_prob": model.config.hidden_dropout_prob,
        "attention_probs_dropout_prob": model.config.attention_probs_dropout_prob,
        "hidden_act": model.config.hidden_act,
        "train_batch_size": args.per_device_train_batch_size * args.gradient_accumulation_steps
        * args.world_size,
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "num_train_epochs": args.num_train_epochs,
        "max_steps": args.max_steps,
        "max_seq_length": max_seq_length,
        "seed": args.seed,
        "num_parameters": count_parameters(model),
        "num_hidden_layers": model.config.num_hidden_layers,
        "hidden_size": model.config.hidden_size,
        "num_attention_heads": model.config.num_attention_heads,
    }


def partial_data_group(group: str | None) -> str:
    """The W&B group of a run on part of the data: its own beside the real runs' (a dashboard
    grouping by group never averages the two)."""
    return fit(f"{group or 'bertkit'}{PARTIAL_GROUP_SUFFIX}", MAX_NAME_LENGTH)


def start_wandb_run(log: DictConfig, job_type: str, config: dict, run_dir: Path,
                    hyperparameters: dict, limited_samples: dict | None = None):
    """Open the run (main process only; `log`: the logger node, `config`: the job's resolved
    config, recorded under "bertkit"); returns it, or None when logging is off. A run whose
    data was cut (`limited_samples`, bertkit.data.metrics_file) is tagged PARTIAL_DATA_TAG
    and grouped apart (partial_data_group)."""
    mode = resolve_wandb_mode(log.mode)
    if log.backend != "wandb" or mode == "disabled":
        return None
    import wandb

    # A sweep prints W&B's banner (version, where the run is saved, its closing summary and
    # sync lines) and the offline notice once, for its first job, not for every job.
    quiet = later_job_of_multirun()
    if mode == "offline" and not quiet:
        logger.warning("W&B: no credentials found (WANDB_API_KEY or `wandb login`): logging "
                       "offline under %s/wandb; upload later with `wandb sync`", run_dir)
    tags = [str(tag) for tag in log.tags]
    # A multirun's runs carry its id (its name and group say the configuration already); a
    # single run of a sweep preset its name, as a tag and a name prefix.
    sweep = log.get("sweep_id")
    name = log.name
    if sweep:
        tags.append(f"{SWEEP_TAG_PREFIX}{sweep}")
    elif log.sweep_tag:
        tags.append(f"{SWEEP_TAG_PREFIX}{log.sweep_tag}")
        name = f"{log.sweep_tag}-{name}"
    group_name = log.group
    if limited_samples:
        tags.append(PARTIAL_DATA_TAG)
        group_name = partial_data_group(group_name)
    settings = mask_secrets({**hyperparameters,
                             **({LIMITED_SAMPLES: limited_samples} if limited_samples else {}),
                             "bertkit": config})
    run_id, name = run_identity(run_dir, name)
    with masked_argv():  # W&B records the command line in the run's metadata
        return wandb.init(
            project=log.project,
            entity=log.entity,
            group=group_name,
            job_type=job_type,
            tags=tags,
            name=name,
            id=run_id,
            resume="allow",  # a resumed run (the same run directory) continues its W&B run
            dir=str(run_dir),
            mode=mode,
            config=settings,
            reinit="finish_previous",
            settings=wandb.Settings(silent=True) if quiet else None,
        )


# The W&B run's id and name, kept in the run directory from its first start: a run resumed
# there (resume=true|auto after a preemption or Ctrl-C, successive halving's next rung) goes
# on in the same W&B run under the same name, where a new id (and a name with the new start
# time) would show it as a second run. overwrite=true sets the file aside with the rest of the
# earlier run: the new run gets a W&B run of its own.
RUN_IDENTITY_FILE = "wandb/bertkit_run.json"


RUN_ID_ALPHABET, RUN_ID_LENGTH = string.ascii_lowercase + string.digits, 8  # as W&B's own


def new_run_id() -> str:
    return "".join(secrets.choice(RUN_ID_ALPHABET) for _ in range(RUN_ID_LENGTH))


def run_identity(run_dir: Path, name: str) -> tuple[str, str]:
    """(id, name) of the run directory's W&B run: the ones stored at its first start, else
    a new id and `name`, stored now (main process)."""
    path = Path(run_dir) / RUN_IDENTITY_FILE
    if path.is_file():
        try:
            stored = read_json(path, expect=dict)
            return str(stored["id"]), str(stored["name"])
        except (BertkitError, KeyError):
            logger.warning("W&B: %s is unreadable, this run starts a new W&B run", path)
    run_id = new_run_id()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"id": run_id, "name": name})
    return run_id, name


# ================================================================================================
# What tells one multirun's W&B runs from another's, and one configuration from another within
# it (conf/logger/wandb.yaml's resolvers, registered by the CLI).
#
# A multirun (bertkit -m) is a sweep with an id of its own: <logger.sweep_tag or multirun>-<the
# multirun directory's name>. Its runs are tagged sweep:<id>, grouped "<id> <the swept settings
# without the replicate keys>" (the same configuration successive halving ranks, so W&B's grouped
# lines average the seeds of one configuration and nothing else) and named "<dataset> <the swept
# settings>", each key by its shortest distinct suffix: "mrpc learning_rate:2e-05 seed:1" (a
# colon as in bertkit's tags: wandb-workspaces' filters read "=" in a value as an operator).
# Outside a multirun every value is the single run's own (the resolver's last argument).
#
# A job sees only its own overrides; which keys the launch sweeps is read from the sweeper's
# params (sweep presets, Optuna's search space) and the launch's command line as Hydra's sweepers
# record it (multirun.yaml in the sweep directory). Keys the sweepers add to a job themselves
# (successive halving's train_fraction and resume) are not settings of it and stay out.

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
    went (bertkit.training.run.finish_wandb)."""
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
    return [f"{short_key(override_key(o), keys)}:{shown_value(o)}"
            for o in configuration_of(overrides, replicate_keys)]


def shown_value(override: str) -> str:
    """An override's value as a name shows it: a secret's by its stand-in (masked-<digest>,
    bertkit.secret_masking.stand_in), which tells two swept tokens apart without showing either."""
    value = override.partition("=")[2]
    return stand_in(value) if is_secret_key(override_key(override)) else value


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


# ================================================================================================
# A multirun job's directory, named by its swept settings (conf/config.yaml's
# hydra.sweep.subdir: ${recipe.dataset}/${bertkit_job_dir:${hydra.job.num}}):
# `rte/finetuning=llrd,seed=2` instead of `rte/5`, so that a reader, a glob and
# bertkit-report --compare's KEY=VALUE selections address a job by what it ran.
#
# The name is Hydra's override_dirname (the job's overrides sorted, "key=value" joined by
# commas) over the keys the launch sweeps only: a setting every job shares (task.data_dir=/abs
# on the command line) says nothing about one job and stays out, and so do the keys a sweeper
# adds to a job itself (successive halving's train_fraction and resume, which change between
# rungs while the job's directory must not) and hydra.* keys. Hydra's own override_dirname
# cannot tell swept keys from the others (its exclude_keys is a fixed list), hence this
# resolver; which keys are swept is read as the W&B names read it (wandb_sweep.swept_keys).
#
# A value that would not make a safe directory name (a path: '/' would nest directories) is
# shown by its last part and a digest of the whole, so two values stay two directories; a
# secret's value (a swept token) by its stand-in, masked-<digest> (bertkit.secret_masking), so
# that no token becomes part of a path that is printed, logged and listed; a name
# longer than a file name may be is cut with a digest of the whole. A job with no swept setting
# (a multirun of one job), or one whose sweeper records no keys, is named by its job number,
# as before.

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
    items = sorted(f"{SAFE.sub('_', override_key(o))}{KEY_VALUE_SEPARATOR}{_safe(shown_value(o))}"
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
