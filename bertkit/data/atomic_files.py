"""Result files written atomically, so that an interrupted run never leaves half a file."""

from __future__ import annotations

import csv
import io
import json
import os
import secrets
from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w"):
    """An open temporary file beside `path` that replaces it only when the block ends without
    an error; mode "w" (UTF-8 text) or "wb"."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_beside(path)
    try:
        text = {"encoding": "utf-8", "newline": ""} if "b" not in mode else {}
        with os.fdopen(fd, mode, **text) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _create_beside(path: Path) -> tuple[int, str]:
    """A new temporary file next to path, opened with mode 0666 so that the umask decides
    who may read the result, as for any file a program writes. tempfile.mkstemp creates 0600:
    results a cluster group could not read."""
    while True:
        tmp = str(path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp"))
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue


def current_umask() -> int:
    """The process's umask, from /proc where Linux has it (reading it with os.umask sets it,
    for a moment, for every thread)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(directory: str | os.PathLike) -> None:
    """Give the files under directory the mode the umask grants. safetensors (0.8) writes its
    weights 0600 whatever the umask, so a saved model or checkpoint was readable by its owner
    alone; called after each save of weights."""
    allowed = 0o666 & ~current_umask()
    for path in Path(directory).rglob("*"):
        if path.is_file() and not path.is_symlink() and (path.stat().st_mode & 0o777) == 0o600:
            path.chmod(allowed)


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    with atomic_file(path) as handle:
        handle.write(text)
    return Path(path)


def write_yaml_atomic(path: str | os.PathLike, document: str) -> Path:
    """A YAML document between explicit start and end markers (--- and ...): a file cut
    short lacks the end marker, where a YAML mapping cut at a line end still parses
    (bertkit.data.readback.read_yaml refuses it)."""
    return write_text_atomic(path, f"---\n{document.rstrip(chr(10))}\n...\n")


def write_json_atomic(path: str | os.PathLike, payload: dict) -> Path:
    return write_text_atomic(path, json.dumps(payload, indent=2, sort_keys=False) + "\n")


def write_tsv_atomic(
    path: str | os.PathLike, header: Sequence[str], rows: Iterable[Sequence]
) -> Path:
    buffer = io.StringIO()
    writer = csv.writer(buffer, delimiter="\t", quoting=csv.QUOTE_NONE, escapechar="\\",
                        lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return write_text_atomic(path, buffer.getvalue())
