"""Secrets (tokens, API keys, passwords) never reach a file or a log: every writer of bertkit
passes what it writes through mask_secrets (docs/reliability.md, "Secrets").

A secret is the value of a config key whose last part matches SECRET_KEYS, from the command line
(+trainer.hub_token=...), a YAML file or an interpolation (${oc.env:...}). The run itself gets
the real value; what it writes gets MASK in its place:
- in a mapping (a config, a record): the value of a secret key;
- in a text (a command line, an override, a message, a traceback): `<secret key>=<value>` and
  `<secret key>: <value>`, each value of a sweep (`a,b`, `choice('a','b')`: still a sweep once
  masked), and every secret value this process has seen (remember_secrets, and the command
  line's before Hydra parses it: remember_command_line), so a secret interpolated into another
  key or quoted by an error message is masked too;
- in a name (a sweep job's directory, its W&B run): a stand-in, masked-<digest>;
- in what the `bertkit` command prints (masked_output), Hydra's own errors included.
A leaf: it imports nothing of bertkit, so that every package (data, reporting, the sweepers)
can call it.
"""

from __future__ import annotations

import hashlib
import logging
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from fnmatch import fnmatchcase

from omegaconf import DictConfig, ListConfig, OmegaConf

# The one list of secret keys: fnmatch patterns on a key's last part, case-insensitive.
# A setting named so is masked wherever bertkit or Hydra writes it; no other setting of bertkit
# may be named so (tests/test_secret_masking.py composes every recipe to check).
SECRET_KEYS = ("hub_token", "*_token", "*api_key*", "*password*", "*secret*")
# What a file shows instead: parses as a Hydra override value (`+trainer.hub_token=***`) and as
# YAML, and reads as a placeholder.
MASK = "***"
# Values this short are masked by their key only, not wherever they appear in a text: a
# password "abc" would otherwise mask every "abc" of a log.
SHORTEST_SECRET_TO_FIND_IN_TEXT = 6

_ALTERNATION = "|".join(re.escape(p).replace(r"\*", r"\w*") for p in SECRET_KEYS)
# What names a secret's value where a name must tell values apart (a sweep job's directory, its
# W&B run name and group): "masked-" and the first digits of the value's SHA-256. Left as it is
# by mask_text, so that a printed path names the directory that exists.
STAND_IN_PREFIX = "masked-"
STAND_IN_DIGITS = 8
_STAND_IN = rf"{re.escape(STAND_IN_PREFIX)}[0-9a-f]{{{STAND_IN_DIGITS}}}(?![\w\-])"
# One value of `key=value`, as Hydra's override grammar writes it: a sweep function
# (choice(a,b), range(1,3), one level of nesting), a list, a quoted string, or a bare word
# (running to the next white space, quote, comma or closing bracket). A sweep's further values
# follow it: `,` and a value that is not the next `key=` (override_dirname joins overrides with
# commas too).
_CALL = r"\w+\((?:[^()\n]|\([^()\n]*\))*\)"
_ELEMENT = rf"""(?:{_CALL}|\[[^\]\n]*\]|'[^'\n]*'|"[^"\n]*"|['"]?[^\s'",\]}})]+)"""
_NEXT = rf"""(?:{_CALL}|\[[^\]\n]*\]|'[^'\n]*'|"[^"\n]*"|[^\s'",=\]}})]+(?=[\s'",\]}})]|$))"""
# `key=value` or `key: value` in a text, the key's last part a secret key: the value is an
# interpolation ${...}, or one value or a sweep's values (above).
_ASSIGNMENT = re.compile(
    rf"(?i)(?<![\w])((?:[\w\-+~]+\.)*(?:{_ALTERNATION})['\"]?\s*[=:]\s*)(?!{_STAND_IN})"
    rf"(\$\{{[^}}]*\}}|{_ELEMENT}(?:,{_NEXT})*)")
# The parts of a value that are masked one by one: a quoted string (its quotes kept), a bare
# word; a sweep function's name is kept (choice(***,***)), so that a masked sweep still reads,
# and parses, as a sweep of as many values.
_ATOM = re.compile(r"""'[^'\n]*'|"[^"\n]*"|\w+(?=\()|[^\s(),\[\]{}'"]+""")
_known: set[str] = set()


def is_secret_key(key: object) -> bool:
    """Whether a config key (dotted or not, with Hydra's +/~ prefixes) names a secret."""
    last = str(key).lstrip("+~").rsplit(".", 1)[-1].lower()
    return any(fnmatchcase(last, pattern) for pattern in SECRET_KEYS)


def _secret_values(value) -> Iterator[str]:
    if isinstance(value, Mapping):
        for key, item in value.items():
            if is_secret_key(key) and isinstance(item, (str, int)) and not isinstance(item, bool):
                yield str(item)
            else:
                yield from _secret_values(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _secret_values(item)


def remember_secrets(cfg: DictConfig | Mapping) -> None:
    """Keep the secret values of a resolved config, so that texts written later (a message, a
    log line, a traceback) are masked wherever these values appear in them. A secret whose
    interpolation cannot be resolved yet is skipped (it is still masked by its key)."""
    if isinstance(cfg, DictConfig):
        try:
            cfg = OmegaConf.to_container(cfg, resolve=True)
        except Exception:  # noqa: BLE001 - a resolver that needs a running Hydra job
            cfg = OmegaConf.to_container(cfg, resolve=False)
    _known.update(v for v in _secret_values(cfg) if _findable(v))


def _findable(value: str) -> bool:
    """Long enough to be looked for in texts, and a value rather than an interpolation."""
    return len(value) >= SHORTEST_SECRET_TO_FIND_IN_TEXT and not value.startswith("${")


def mask_text(text: str, values: Iterable[str] = ()) -> str:
    """text with `<secret key>=<value>` masked, and every secret value (these and those
    remembered) wherever it appears."""
    masked = _ASSIGNMENT.sub(lambda m: m.group(1) + _masked_value(m.group(2)), text)
    for value in sorted({*_known, *values}, key=len, reverse=True):
        masked = masked.replace(value, MASK)
    return masked


def _masked_value(value: str) -> str:
    """A secret's value (or a sweep's values) masked part by part: `a,b` -> `***,***`,
    `choice('a','b')` -> `choice('***','***')`; an interpolation as a whole."""
    if value.startswith("${"):
        return MASK
    return _ATOM.sub(_masked_atom, value)


def _masked_atom(match: re.Match) -> str:
    atom = match[0]
    if match.string[match.end():match.end() + 1] == "(":  # a sweep function's name
        return atom
    if len(atom) > 1 and atom[0] in "'\"" and atom[-1] == atom[0]:
        return f"{atom[0]}{MASK}{atom[0]}"
    return MASK


def stand_in(value: object) -> str:
    """What names a secret's value in a name (a directory, a W&B run name): the same value
    gets the same name and two values two names, and the value cannot be read back from it."""
    digest = hashlib.sha256(str(value).encode()).hexdigest()[:STAND_IN_DIGITS]
    return f"{STAND_IN_PREFIX}{digest}"


def remember_command_line(arguments: Iterable[str]) -> None:
    """Keep the secret values of command-line overrides (each value of a sweep:
    `+trainer.hub_token=a,b`, `choice('a','b')`) before Hydra parses them, so that whatever
    is printed from then on, a parse error of the override itself included, is masked."""
    for argument in arguments:
        key, assigned, value = argument.partition("=")
        if not assigned or not is_secret_key(key) or "${" in value:
            continue
        parts = [match[0].strip("'\"") for match in _ATOM.finditer(value)
                 if value[match.end():match.end() + 1] != "("]  # not choice, range, ...
        _known.update(v for v in (value, *parts) if _findable(v))


def mask_secrets(value):
    """value with every secret masked: mappings, lists, texts, configs (a DictConfig comes back
    as plain containers, its interpolations kept as text); anything else as it is. A secret of
    value found anywhere else in it (interpolated into another key) is masked there too."""
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value, resolve=False)
    own = {v for v in _secret_values(value) if _findable(v)}
    return _masked(value, own)


def _masked(value, values: set[str]):
    if isinstance(value, str):
        return mask_text(value, values)
    if isinstance(value, Mapping):
        return {key: MASK if is_secret_key(key) and item is not None
                else _masked(item, values) for key, item in value.items()}
    if isinstance(value, list) or type(value) is tuple:
        return type(value)(_masked(item, values) for item in value)
    return value


def mask_logs() -> None:
    """Every log record of this process (bertkit's, Hydra's, a library's) is made with its
    secrets masked, message and traceback: at the record's making, not in a handler, because
    Hydra sets up its handlers anew for a launch and for each job."""
    make = logging.getLogRecordFactory()
    if getattr(make, "masks_secrets", False):
        return

    def masked_record(*args, **kwargs) -> logging.LogRecord:
        record = make(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed call: logging reports it when it emits
            return record
        masked = mask_text(message)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info:
            record.exc_text = mask_text(logging.Formatter().formatException(record.exc_info))
        return record

    masked_record.masks_secrets = True
    logging.setLogRecordFactory(masked_record)


@contextmanager
def masked_argv() -> Iterator[None]:
    """sys.argv masked for the time of a call that records it (W&B's run metadata)."""
    real = sys.argv
    sys.argv = [mask_text(arg) for arg in real]
    try:
        yield
    finally:
        sys.argv = real


class MaskedText:
    """A text stream (sys.stdout, sys.stderr) whose writes are masked (mask_text); everything
    else is the stream's own."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(mask_text(text) if isinstance(text, str) else text)
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


@contextmanager
def masked_output() -> Iterator[None]:
    """What this process prints on stdout and stderr masked for the time of the call, and
    after it when an exception ends it (the interpreter prints its traceback then). A net
    under the writers of bertkit, which mask what they write themselves: Hydra prints its
    errors with print() and sys.stderr.write (an override's syntax error quoting the
    override, a failed job's traceback), and so may any library."""
    real = sys.stdout, sys.stderr
    # None where the process has no such stream (print() then writes nothing).
    sys.stdout, sys.stderr = (None if stream is None else MaskedText(stream) for stream in real)
    ended = True
    try:
        yield
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException:
        ended = False
        raise
    finally:
        if ended:
            sys.stdout, sys.stderr = real
