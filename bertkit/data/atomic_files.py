"""Result files written atomically, so that an interrupted run never leaves half a file; and
every write bertkit makes (these files, checkpoints, the saved model, cache entries) told, when
the disk refuses it, as one line naming the file, what it was and the space left.

What the libraries raise on a real full disk (tmpfs; torch 2.13, safetensors 0.8, datasets 5.2)
carries no common type, and torch's C++ writer no errno at all:

    torch.save(path)        RuntimeError "[enforce fail at inline_container.cc:...] . unexpected
                            pos 576 vs 534", from RuntimeError "basic_ios::clear: iostream error"
    torch.save(open file)   OSError ENOSPC, from that RuntimeError
    safetensors save_file, save_model, save_pretrained
                            SafetensorError "Error while serializing: I/O error: No space left
                            on device (os error 28)"
    json, the writers here  OSError ENOSPC (filename None)
    datasets map, save_to_disk
                            OSError ENOSPC (map leaves its tmpXXXXXXXX file behind)

Over a file-size limit (ulimit -f, SIGXFSZ ignored) the same, with EFBIG (os error 27).
"""

from __future__ import annotations

import csv
import errno
import io
import json
import os
import re
import secrets
import shutil
import traceback
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
from pathlib import Path

from bertkit.errors import BertkitError


@contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w"):
    """An open temporary file beside `path` that replaces it only when the block ends without
    an error; mode "w" (UTF-8 text) or "wb". A refused write (a full disk) removes the
    temporary file and ends in failed_write's one line."""
    path = Path(path)
    kept = f"{path.name} is as it was before" if path.exists() else f"no {path.name} was left"
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = _create_beside(path)
        text = {"encoding": "utf-8", "newline": ""} if "b" not in mode else {}
        with os.fdopen(fd, mode, **text) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        told = failed_write(err, "a result file", path, then=kept,
                            leftovers=[Path(tmp)] if tmp else []) \
            if isinstance(err, Exception) else None
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        if told is not None:
            raise told from err
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


# The errors of a write the disk refuses: full, over a quota, over the file-size limit, read-only
# or failing; with what to add to the system's words. Reading a file never raises these.
REFUSED_WRITE_ERRNOS = {errno.ENOSPC: "", errno.EDQUOT: "", errno.EROFS: "",
                        errno.EFBIG: " (over the file-size limit: see `ulimit -f`)",
                        errno.EIO: " (the disk or the network filesystem failed)"}
# Rust's io::Error as safetensors words it: "... No space left on device (os error 28)".
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")
# torch.save's C++ zip writer (PyTorchStreamWriter) when a write fails: no errno in any of them.
_TORCH_WRITER = re.compile(r"inline_container|PytorchStreamWriter|iostream error")
NO_ERRNO = 0  # refused_write's answer for torch's writer


def refused_write(err: BaseException | None) -> int | None:
    """The errno of a refused write found in err or the errors that caused it (NO_ERRNO:
    torch's writer failed, which gives none); None when err is no failed write."""
    found, seen = None, set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in REFUSED_WRITE_ERRNOS:
            return err.errno
        rust = _RUST_OS_ERROR.search(str(err))
        if rust and int(rust.group(1)) in REFUSED_WRITE_ERRNOS:
            return int(rust.group(1))
        if isinstance(err, RuntimeError) and _TORCH_WRITER.search(str(err)):
            found = NO_ERRNO  # an errno further down the chain says more
        err = err.__cause__ or err.__context__
    return found


def failed_write(err: BaseException, what: str, path: str | os.PathLike, *,
                 leftovers: Iterable[Path] = (), then: str = "") -> BertkitError | None:
    """The one line for err when it is a refused write of `what` at `path` (the file or the
    folder being written), once `leftovers` (what the write left half done) are removed; None
    when err is something else. The free space is read first: the space the write found."""
    code = refused_write(err)
    if code is None:
        return None
    written = _written_file(err, Path(path))
    where = next(folder for folder in (written, *written.parents) if folder.exists())
    usage = shutil.disk_usage(where)
    if code != NO_ERRNO:
        words = os.strerror(code)
        reason = words[0].lower() + words[1:] + REFUSED_WRITE_ERRNOS[code]
    elif usage.free < os.statvfs(where).f_bsize:  # not one block left: the disk is full
        reason = "no space left on device"
    else:
        reason = (f"torch's writer failed ({str(err).splitlines()[0]}) with space left, "
                  f"so a file-size limit (`ulimit -f`) or a quota")
    _close_what_it_held(err)
    for leftover in leftovers:
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)
    return BertkitError(f"{reason} while writing {written} ({what}; {_size(usage.free)} of "
                        f"{_size(usage.total)} free there)" + (f"; {then}" if then else ""))


@contextmanager
def telling_failed_writes(what: str, path: str | os.PathLike, *,
                          leftovers: Callable[[], Iterable[Path]] = tuple, then: str = ""):
    """A block that writes `what` at `path`: a refused write ends it with failed_write's
    line (leftovers() lists what it left half done, asked only then)."""
    try:
        yield
    except Exception as err:
        told = failed_write(err, what, path, leftovers=leftovers(), then=then)
        if told is None:
            raise
        raise told from err


def _close_what_it_held(err: BaseException | None) -> None:
    """Clears the finished frames of err's tracebacks: torch's failed writer stays open in
    them, holding the removed file's space for as long as the error is kept (a notebook, a
    sweep's next job)."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        traceback.clear_frames(err.__traceback__)
        err = err.__cause__ or err.__context__


def _written_file(err: BaseException | None, path: Path) -> Path:
    """The file the failed write was writing: the one its error names, else `path`, or the
    newest file under it when it is a folder (a checkpoint's files are written in turn)."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.filename:
            return Path(err.filename)
        err = err.__cause__ or err.__context__
    files = [file for file in path.rglob("*") if file.is_file()] if path.is_dir() else []
    # Modification times tick at the kernel's clock (a few ms): two files written in one tick
    # tie, and then the one created later (the higher inode number, as tmpfs and ext4 hand
    # them out) is the one whose write failed.
    return max(files, key=lambda file: (file.stat().st_mtime_ns, file.stat().st_ino)) \
        if files else path


def _size(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"
