"""The Hugging Face Hub: whether it can be reached, decided once per process before the first
Hub name is looked up, and datasets.load_dataset for the task families.

Without network, every Hub call of huggingface_hub retries for about 20 s before it fails, and a
run makes several (config, tokenizer, custom-code checks, the dataset): minutes of duplicated
warnings before one error. So a job first asks `require_hub` for each Hub name it is about to
use (a local path never does): with HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE set the Hub is off;
else one connection to huggingface_hub's endpoint, bounded by hub_check_seconds (conf/config.yaml),
decides, once. Off, the libraries are put in offline mode (files in the Hub cache still load, a
missing one fails at once), and the failure is one line naming the local ways (`offline_error`).
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from urllib.parse import urlsplit

import datasets

from bertkit.errors import BertkitError

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

