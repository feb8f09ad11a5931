"""A task's data: where it comes from (local files in the benchmark's original layout, or the Hub,
whether it can be reached and its datasets: the last section; uses_local_files, the one place
this is decided for every family; split_files: which local file each split reads, for the
families whose splits are named once), what a family's reader hands on (the raw splits of a task
with the fingerprint of each), and what the finetune job carries from data preparation to
evaluation.

A dataclass rather than attributes set on `datasets` objects: any `datasets` call that returns
a new object (map, select, concatenate) silently drops such attributes.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlsplit

import datasets
from omegaconf import DictConfig, OmegaConf

from bertkit.data.cache import content_fingerprint
from bertkit.errors import BertkitError

DATA_SOURCES = ("auto", "hub", "local")
# task.<split>_file keys that name one local file for a split.
SINGLE_FILE_KEYS = {"train": "train_file", "validation": "validation_file", "test": "test_file"}


def uses_local_files(task: DictConfig, data_source: str) -> bool:
    """data_source=auto: local when task.data_dir or a task.*_file is set, or the task has no
    Hub dataset (task.hub is null). data_source is one of DATA_SOURCES (the schema's
    choices are these: bertkit.config_schema.RunSchema)."""
    # A task family without a test file (SQuAD) has no test_file key: select, not index.
    local = bool(task.data_dir) or any(OmegaConf.select(task, key)
                                       for key in SINGLE_FILE_KEYS.values())
    if data_source == "hub" and task.hub is None:
        raise BertkitError(f"task {task.name} has no Hub dataset (task.hub is null)")
    return data_source == "local" or (data_source == "auto" and (local or task.hub is None))

def split_files(task: DictConfig, required: tuple[str, ...], release: str,
                optional: tuple[str, ...] = ()) -> dict[str, Path]:
    """Split -> an existing file, or one error naming the key and the missing file. An
    optional split (a test set) is read when task.data_dir has its file or it is given."""
    files: dict[str, Path] = {}
    if task.data_dir and not Path(task.data_dir).is_dir():
        raise BertkitError(f"task.data_dir={task.data_dir}: no such directory")
    for split in (*required, *optional):
        single = task[f"{split}_file"]
        if single:
            path, key = Path(single), f"task.{split}_file"
        elif task.data_dir:
            path, key = Path(task.data_dir) / task.files[split], "task.data_dir"
            if split in optional and not path.is_file():
                continue
        elif split in required:
            raise BertkitError(f"task {task.name}: no {split} file (task.data_dir or "
                               f"task.{split}_file)")
        else:
            continue
        if not path.is_file():
            raise BertkitError(f"{key}: {path} not found (the {split} split of {task.name}, "
                               f"{task.files[split]} in {release})")
        files[split] = path
    return files


# The task key that caps the examples of a split, by the split name's first word (MNLI's
# validation_matched and test_mismatched too): run_glue.py's --max_train_samples,
# --max_eval_samples and --max_predict_samples, with its meaning (the first N examples).
SAMPLE_LIMIT_KEYS = {"train": "max_train_samples", "validation": "max_eval_samples",
                     "test": "max_predict_samples"}


@dataclass
class TaskSplits(Mapping):
    """Raw examples per split (read as a mapping split -> table), and per split a fingerprint
    of its content and reading rules (the key of its cache entries) and facts about the source
    (NER: its tag scheme)."""

    tables: dict[str, datasets.Dataset]
    fingerprints: dict[str, str]
    facts: dict[str, dict] = field(default_factory=dict)
    # Splits cut to their first examples (first_examples): {split: {examples, of}}.
    limited: dict[str, dict] = field(default_factory=dict)

    def __getitem__(self, split: str) -> datasets.Dataset:
        return self.tables[split]

    def __iter__(self) -> Iterator[str]:
        return iter(self.tables)

    def __len__(self) -> int:
        return len(self.tables)

    def fingerprint(self, *splits: str) -> str:
        """One fingerprint for several splits (all of them when none is named)."""
        return content_fingerprint(*(part for split in (splits or sorted(self.tables))
                                     for part in (split, self.fingerprints[split])))


def sample_limit_key(split: str) -> str:
    """The task key that caps `split` (SAMPLE_LIMIT_KEYS)."""
    prefix = split.split("_")[0]
    if prefix not in SAMPLE_LIMIT_KEYS:
        raise ValueError(f"split {split!r}: not a train, validation or test split, so no "
                         f"task.max_*_samples caps it")
    return SAMPLE_LIMIT_KEYS[prefix]


def first_examples(splits: TaskSplits, limits: Mapping[str, int | None]) -> TaskSplits:
    """The first N examples of each split that limits (task key -> N, or None: all) caps,
    as run_glue.py's dataset.select(range(N)): applied to the raw examples, before any
    tokenisation, so that a smoke run of SST-2 tokenises 64 examples and not 67,349. A cut
    split's fingerprint names N, so that its cache entries are its own and never the full
    split's; a split of N examples or fewer is the full split, and keeps its fingerprint."""
    tables, fingerprints, limited = dict(splits.tables), dict(splits.fingerprints), {}
    for split, table in splits.tables.items():
        limit = limits.get(sample_limit_key(split))
        if limit is None or limit >= len(table):
            continue
        tables[split] = table.select(range(limit))
        fingerprints[split] = content_fingerprint(splits.fingerprints[split], "first", str(limit))
        limited[split] = {"examples": limit, "of": len(table)}
    if not limited:
        return splits
    return replace(splits, tables=tables, fingerprints=fingerprints,
                   limited={**splits.limited, **limited})


@dataclass
class TaskData:
    """A run's data: the raw splits (prediction files, answer decoding), the model's features
    per split, and facts for metrics.json's "data" (counts, tag schemes)."""

    splits: TaskSplits
    features: dict[str, datasets.Dataset]
    facts: dict = field(default_factory=dict)


# ================================================================================================
# The Hugging Face Hub: whether it can be reached, decided once per process before the first
# Hub name is looked up, and datasets.load_dataset for the task families.
#
# Without network, every Hub call of huggingface_hub retries for about 20 s before it fails, and a
# run makes several (config, tokenizer, custom-code checks, the dataset): minutes of duplicated
# warnings before one error. So a job first asks `require_hub` for each Hub name it is about to
# use (a local path never does): with HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE set the Hub is off;
# else one connection to huggingface_hub's endpoint, bounded by hub_check_seconds
# (conf/config.yaml), decides, once. Off, the libraries are put in offline mode (files in the
# Hub cache still load, a missing one fails at once), and the failure is one line naming the
# local ways (`offline_error`).

# The variables that put huggingface_hub, transformers and datasets offline (their own names).
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
TRUE_VALUES = ("1", "ON", "YES", "TRUE")  # huggingface_hub's reading of a boolean variable
DEFAULT_PORTS = {"https": 443, "http": 80}


# What the job set (use_hub_settings): "check_seconds", the bound on the reachability check
# (absent: no job set it, no check, the libraries' way), and "local_ways", read when an offline
# error names them.
_settings: dict = {}
_reachable: dict[str, bool] = {}  # endpoint -> whether it answered (once per process)


def use_hub_settings(check_seconds: float | None,
                     local_ways: Callable[[], str] | None = None) -> None:
    """The job's settings (bertkit.jobs.prepare_job); nothing is checked until a Hub name is
    needed."""
    _settings.update(check_seconds=check_seconds, local_ways=local_ways)


def offline_by_environment() -> bool:
    """A variable of OFFLINE_VARIABLES is set true."""
    return any(os.environ.get(name, "").upper() in TRUE_VALUES for name in OFFLINE_VARIABLES)


def endpoint() -> str:
    """The Hub endpoint huggingface_hub calls (HF_ENDPOINT, else https://huggingface.co)."""
    import huggingface_hub.constants

    return huggingface_hub.constants.ENDPOINT


def endpoint_answers(url: str, seconds: float) -> bool:
    """Whether a TCP connection to url's host and port opens within `seconds`, name lookup
    included (in a thread: getaddrinfo itself has no timeout)."""
    parts = urlsplit(url)
    host, port = parts.hostname, parts.port or DEFAULT_PORTS.get(parts.scheme, 443)
    if not host:
        return False
    answered = threading.Event()

    def connect() -> None:
        try:
            with socket.create_connection((host, port), timeout=seconds):
                answered.set()
        except OSError:
            pass

    thread = threading.Thread(target=connect, daemon=True, name="bertkit-hub-check")
    thread.start()
    thread.join(seconds)
    return answered.is_set()


def hub_reachable() -> bool:
    """Whether the Hub can be reached: False with an offline variable set, else the answer of
    one bounded check of the endpoint, made once per process (True without a job's setting:
    the libraries decide as they do)."""
    if offline_by_environment():
        return False
    if _settings.get("check_seconds") is None:
        return True
    url = endpoint()
    if url not in _reachable:
        _reachable[url] = endpoint_answers(url, _settings["check_seconds"])
    return _reachable[url]


def known_offline() -> bool:
    """The Hub is known to be off (an offline variable, or the process's check said so),
    without checking now."""
    return offline_by_environment() or False in _reachable.values()


def go_offline() -> None:
    """huggingface_hub, transformers and datasets in offline mode: they read the variables at
    import, so their flags are set too. Files in the Hub cache still load; a missing one fails
    at once instead of retrying."""
    for name in OFFLINE_VARIABLES:
        os.environ[name] = "1"
    import huggingface_hub.constants

    huggingface_hub.constants.HF_HUB_OFFLINE = True
    datasets.config.HF_HUB_OFFLINE = True
    datasets.config.HF_DATASETS_OFFLINE = True


def require_hub() -> bool:
    """Called before a Hub name is used: whether the Hub can be reached; when it cannot, the
    libraries are put offline first (go_offline)."""
    if hub_reachable():
        return True
    go_offline()
    return False


def why_offline() -> str:
    """Why the Hub is off, for messages."""
    set_names = [name for name in OFFLINE_VARIABLES
                 if os.environ.get(name, "").upper() in TRUE_VALUES]
    if set_names and not _reachable:
        return f"{'/'.join(set_names)} set"
    return f"{endpoint()} did not answer within hub_check_seconds={_settings.get('check_seconds')}"


def offline_error(setting: str, what: str) -> BertkitError:
    """One line for a Hub name that is not in the Hub cache while the Hub is off: the setting,
    why the Hub is off, and the local ways (the job's, use_hub_settings)."""
    local_ways = _settings.get("local_ways")
    ways = f" Work offline with {local_ways()}." if local_ways else ""
    return BertkitError(
        f"{setting}: {what} is on the Hub, which cannot be reached ({why_offline()}), and is not "
        f"in the Hub cache.{ways} HF_HUB_OFFLINE=1 skips the Hub check.")


def load_hub_dataset(what: str, local_files: str, *args, **kwargs):
    """datasets.load_dataset(*args, **kwargs); what: "the Hub dataset X ..." for the message,
    local_files: what to give without network ("give the original JSON files: ...")."""
    online = require_hub()  # without the Hub: offline mode, the Hub cache or one error
    try:
        return datasets.load_dataset(*args, **kwargs)
    except Exception as err:  # offline, unknown name, ...: one message, not a Hub traceback
        reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        if not online:
            local_files = (f"{local_files.rstrip('.')}. The Hub cannot be reached "
                           f"({why_offline()}); HF_HUB_OFFLINE=1 skips the Hub check.")
        raise BertkitError(f"could not load {what} ({reason}). Without network, "
                           f"{local_files}") from None
