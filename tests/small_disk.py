"""A real full disk for tests of what bertkit's writers do when a write is refused: a small
tmpfs where mounting is allowed (root with CAP_SYS_ADMIN), else a file-size limit
(RLIMIT_FSIZE, with SIGXFSZ ignored so that a write over it fails with EFBIG instead of killing
the process). Either way the kernel refuses the write, and torch, safetensors, Arrow and
Python raise what they raise on a full disk; nothing is mocked.

A test writes in `disk.path` and calls `disk.fill(leave=n)` at the moment the disk should
fill: tmpfs then holds a ballast file leaving n bytes free; the file-size limit becomes n
bytes (per file, where tmpfs counts all files: a test keeps to "a file over n bytes does not
fit"). `disk.free_again()` undoes it.
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import signal
import subprocess
import uuid
from contextlib import contextmanager
from pathlib import Path

TMPFS, FILE_SIZE_LIMIT = "tmpfs", "file-size limit"
TMPFS_SIZE = "64m"  # far more than a tiny run writes: the ballast decides when it is full


def _mount(folder: Path) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs",
                           str(folder)], capture_output=True)
    return done.returncode == 0


def _unmount(folder: Path) -> None:
    """Unmounts folder; a file still open there (which would hold a removed file's space) is
    reported once the mount is detached."""
    if subprocess.run(["umount", str(folder)], capture_output=True).returncode == 0:
        return
    held = [os.readlink(fd) for fd in Path("/proc/self/fd").iterdir()
            if fd.is_symlink() and os.readlink(fd).startswith(str(folder))]
    subprocess.run(["umount", "--lazy", str(folder)], check=True, capture_output=True)
    raise AssertionError(f"files still open on the small disk: {held}")


@functools.cache
def can_mount_tmpfs() -> bool:
    probe = Path(f"/tmp/bertkit-tmpfs-probe-{uuid.uuid4().hex}")
    try:
        mounted = _mount(probe)
        if mounted:
            _unmount(probe)
        return mounted
    finally:
        probe.rmdir() if probe.is_dir() else None


def disk_kinds() -> list[str]:
    """The small disks this machine allows, the truest first."""
    return [TMPFS, FILE_SIZE_LIMIT] if can_mount_tmpfs() else [FILE_SIZE_LIMIT]


class SmallDisk:
    def __init__(self, kind: str, path: Path):
        self.kind, self.path = kind, path
        self._ballast = path / ".ballast"
        self._limit = self._handler = None

    def fill(self, leave: int) -> None:
        if self.kind == TMPFS:
            free = shutil.disk_usage(self.path).free
            fd = os.open(self._ballast, os.O_WRONLY | os.O_CREAT)
            try:
                os.posix_fallocate(fd, 0, free - leave)
            finally:
                os.close(fd)
        else:
            self._handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            self._limit = resource.getrlimit(resource.RLIMIT_FSIZE)
            resource.setrlimit(resource.RLIMIT_FSIZE, (leave, self._limit[1]))

    def free_again(self) -> None:
        self._ballast.unlink(missing_ok=True)
        if self._limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, self._limit)
            signal.signal(signal.SIGXFSZ, self._handler)
            self._limit = None

    def files(self) -> list[str]:
        """Every file on the disk, relative to it, the ballast left out."""
        return sorted(str(path.relative_to(self.path)) for path in self.path.rglob("*")
                      if path.is_file() and path != self._ballast)


@contextmanager
def small_disk(tmp_path: Path, kind: str):
    path = tmp_path / "disk"
    path.mkdir()
    if kind == TMPFS and not _mount(path):
        raise RuntimeError(f"cannot mount a tmpfs on {path}")
    disk = SmallDisk(kind, path)
    try:
        yield disk
    finally:
        disk.free_again()
        if kind == TMPFS:
            _unmount(path)
