"""Compressed files read as if plain: gzip, bzip2 and xz with the standard library, zstd with
Python 3.14's compression.zstd or the `zstandard` package when one is there. The format is
told by the file's first bytes (its magic number), not its name, so a mislabelled file is read
right or refused, never decoded as text."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import lzma
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from bertkit.errors import BertkitError

# bzip2's magic is "BZh" and a block size digit: a text that starts "BZh" is still text.
MAGIC = {b"\x1f\x8b": "gzip", **{b"BZh" + bytes([digit]): "bzip2" for digit in b"123456789"},
         b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd"}
SUFFIXES = {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz", ".zst": "zstd"}
READABLE = "gzip (.gz), bzip2 (.bz2), xz (.xz) or zstd (.zst)"
# Errors the decompressors raise on a truncated or corrupt stream.
CORRUPT = (EOFError, OSError, lzma.LZMAError, ValueError)
TAIL_BYTES = 1 << 16


def _zstd_open() -> Callable[[Path], BinaryIO] | None:
    try:
        from compression import zstd  # Python 3.14+
    except ImportError:
        try:
            import zstandard as zstd
        except ImportError:
            return None
    return lambda path: zstd.open(path, "rb")


def compression_of(path: Path) -> str | None:
    """gzip | bzip2 | xz | zstd by the file's magic number; None for anything else."""
    with open(path, "rb") as handle:
        head = handle.read(6)
    return next((name for magic, name in MAGIC.items() if head.startswith(magic)), None)


def open_decompressed(path: Path) -> BinaryIO:
    """The file's bytes, decompressed when its magic number says it is compressed. A name
    ending in .gz/.bz2/.xz/.zst over other content is refused: the file is not what it says."""
    path = Path(path)
    compression = compression_of(path)
    named = SUFFIXES.get(path.suffix.lower())
    if named is not None and compression != named:
        raise BertkitError(f"{path}: named {path.suffix} but its content is not {named} data "
                           f"(truncated, or misnamed)")
    if compression == "gzip":
        return gzip.open(path, "rb")
    if compression == "bzip2":
        return bz2.open(path, "rb")
    if compression == "xz":
        return lzma.open(path, "rb")
    if compression == "zstd":
        opener = _zstd_open()
        if opener is None:
            raise BertkitError(f"{path}: zstd-compressed; reading it needs Python 3.14+ or the "
                               f"zstandard package (pip install 'bertkit[zstd]'), or decompress "
                               f"it first (zstd -d)")
        return opener(path)
    return open(path, "rb")


def read_chunks(path: Path, size: int = 1 << 20):
    """The decompressed bytes in chunks; a corrupt or truncated stream is one BertkitError."""
    compression = compression_of(path)
    with open_decompressed(path) as handle:
        while True:
            try:
                chunk = handle.read(size)
            except CORRUPT as err:
                raise BertkitError(f"{path}: corrupt or truncated {compression} data "
                                   f"({type(err).__name__}: {err})") from None
            if not chunk:
                return
            yield chunk


def text_stream(path: Path, encoding: str) -> io.TextIOWrapper:
    """The decompressed file as text, with universal newlines as open() gives plain files."""
    return io.TextIOWrapper(open_decompressed(path), encoding=encoding)


def compressed_tail_digest(path: Path) -> str | None:
    """sha256 of a compressed file's last 64 KiB; None for a plain file. The last bytes of each
    format hold a checksum of the decompressed content (gzip's CRC-32 and length, bzip2's
    stream CRC, xz's check and index, zstd's content checksum when written), so a file
    recompressed to the same size and mtime (gzip keeps its source's mtime) still differs."""
    if compression_of(path) is None:
        return None
    with open(path, "rb") as handle:
        handle.seek(max(0, path.stat().st_size - TAIL_BYTES))
        return hashlib.sha256(handle.read()).hexdigest()
