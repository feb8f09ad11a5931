"""Files whole: written whole, read back whole.

Result files written atomically, so that an interrupted run never leaves half a file; and
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

Below them, the readers that check a file is whole before it is used (read_json, check_arrow,
...), and benchmark files read as UTF-8 text (read_utf8).
"""

from __future__ import annotations

import csv
import errno
import io
import json
import logging
import os
import re
import secrets
import shutil
import traceback
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import yaml

from bertkit.errors import BertkitError

logger = logging.getLogger(__name__)

END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # Arrow IPC: continuation, length 0
SAVED_DATASET_FILES = ("state.json", "dataset_info.json")
JSON_NAMES = {dict: "object", list: "array", str: "string", int: "number", float: "number",
              bool: "boolean", type(None): "null"}
YAML_NAMES = {dict: "mapping", list: "list", type(None): "empty file"}


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
    (read_yaml, below refuses it)."""
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


# ================================================================================================
# One verifying reader per format for every file bertkit reads back (Arrow, JSON, YAML, text).
#
# The rule: a file that a crash, a full disk or a partial copy cut is never read as data. Each
# reader checks that the file is whole before anything uses it and raises DamagedFile, one line
# naming the file, when it is not. Callers decide what a damaged file means: a cache entry is
# deleted and rebuilt (`discard_damaged`), a result is refused (the report names it and goes on).
#
# Arrow files are datasets' IPC streams; a stream cut at a record-batch boundary still parses, so
# the check also requires the end-of-stream marker the writer puts last. Only message headers are
# read (the bodies are memory-mapped, not copied), so checking a large cache costs little.

class DamagedFile(BertkitError):
    """A file bertkit wrote earlier is cut or corrupt; the message names it."""


def _damaged(path: Path, why: object) -> DamagedFile:
    reason = " ".join(str(why).split()) or type(why).__name__
    return DamagedFile(f"{path}: {reason}")


def read_text(path: str | os.PathLike) -> str:
    """A UTF-8 text file bertkit wrote."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise _damaged(path, f"cannot read: {err}") from None


def read_json(path: str | os.PathLike, expect: type = dict):
    """A JSON file holding one value of type `expect` (an object unless told)."""
    path = Path(path)
    try:
        data = json.loads(read_text(path))
    except json.JSONDecodeError as err:
        raise _damaged(path, f"not valid JSON: {err}") from None
    if not isinstance(data, expect):
        raise _damaged(path, f"expected a JSON {JSON_NAMES.get(expect, expect.__name__)}, "
                             f"found {JSON_NAMES.get(type(data), type(data).__name__)}")
    return data


def read_yaml(path: str | os.PathLike, expect: type = dict):
    """A YAML file holding one value of type `expect` (a mapping unless told). A document that
    opens with the start marker (---, as bertkit.data.atomic_files.write_yaml_atomic writes)
    must close with the end marker (...): a mapping cut at a line end still parses. Files
    without the start marker (written before, or by hand) are read as they are."""
    path = Path(path)
    text = read_text(path)
    if text.startswith("---\n") and not text.endswith("\n...\n"):
        raise _damaged(path, "cut YAML document: it opens with --- but does not end with ...")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise _damaged(path, f"not valid YAML: {err}") from None
    if not isinstance(data, expect):
        raise _damaged(path, f"expected a YAML {YAML_NAMES.get(expect, expect.__name__)}, "
                             f"found {YAML_NAMES.get(type(data), type(data).__name__)}")
    return data


def check_arrow(path: str | os.PathLike) -> None:
    """An Arrow IPC stream (what datasets writes) read through to its end-of-stream marker."""
    path = Path(path)
    try:
        with pa.memory_map(str(path)) as source:
            size = source.size()
            reader = pa.ipc.open_stream(source)
            for _ in reader:
                pass
            end = source.tell()
            source.seek(max(size - len(END_OF_STREAM), 0))
            tail = source.read()
    except (pa.ArrowException, OSError, ValueError) as err:
        raise _damaged(path, f"cut or corrupt Arrow file: {err}") from None
    if tail != END_OF_STREAM or end != size:
        raise _damaged(path, f"cut Arrow file: the stream ends at byte {end} of {size} without "
                             f"its end-of-stream marker")


def check_saved_dataset(directory: str | os.PathLike) -> None:
    """A Dataset.save_to_disk directory: its state, info and every data file it lists."""
    directory = Path(directory)
    state = read_json(directory / "state.json")
    read_json(directory / "dataset_info.json")
    files = state.get("_data_files")
    if not isinstance(files, list) or not files:
        raise _damaged(directory / "state.json", "lists no data file")
    for entry in files:
        check_arrow(directory / str(entry.get("filename") if isinstance(entry, dict) else ""))


def discard_damaged(paths: list[Path], check: Callable[[], None], what: str) -> bool:
    """Run `check` on a cache item; if it finds the item damaged, delete `paths` (files or
    directories) so that the caller rebuilds it. True when something was deleted."""
    try:
        check()
    except DamagedFile as err:
        logger.warning("%s; rebuilding the %s", err, what)
        for path in paths:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            elif path.exists() or path.is_symlink():
                path.unlink()
        return True
    return False


def discard_damaged_arrow_cache(root: str | os.PathLike, maps_only: bool = False) -> int:
    """Every datasets cache under root checked: a damaged map result (cache-*.arrow) is deleted,
    a damaged dataset (its Arrow data or dataset_info.json/state.json) loses its whole
    directory, the map results in it included; datasets rebuilds them on the next read.
    Directories still being written (*.incomplete, temporary files) are left alone. maps_only:
    check the map results alone (a dataset already loaded from root). Returns how many were
    deleted."""
    root = Path(root)
    if not root.is_dir():
        return 0
    deleted = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.endswith(".incomplete")
                             and not d.startswith("tmp"))
        here = Path(dirpath)
        checks = [(here / name, check_arrow) for name in sorted(filenames)
                  if name.endswith(".arrow") and (name.startswith("cache-") or not maps_only)]
        if not maps_only:
            checks += [(here / name, read_json) for name in SAVED_DATASET_FILES
                       if name in filenames]
        for path, check in checks:
            whole = not path.name.startswith("cache-") and here != root
            target = [here] if whole else [path]
            if discard_damaged(target, lambda p=path, c=check: c(p),
                               "dataset" if whole else "cached map result"):
                deleted += 1
                if whole:
                    dirnames.clear()
                    break
    return deleted


# ================================================================================================
# Benchmark files as text: UTF-8 (a byte-order mark, as MRPC's files or an editor write it,
# is not an error), and one message naming the file and line when a byte is not UTF-8.

def read_utf8(path: Path) -> str:
    raw = Path(path).read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise BertkitError(f"{path}, line {line}: not valid UTF-8 ({err.reason})") from None
