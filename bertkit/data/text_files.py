"""Files read as text: compressed ones read as if plain, and what is not text refused (the
last section).

Compressed files read as if plain: gzip, bzip2 and xz with the standard library, zstd with
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


# ================================================================================================
# What is not text: a known file signature, a NUL byte, or many control bytes. Text read
# with a Latin-1 fallback decodes any byte, so without this check an image or an archive would
# be read as prose and trained on without a word.

# (offset, signature, what the file is); checked on the first bytes (decompressed).
SIGNATURES = [
    (0, b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (0, b"\xff\xd8\xff", "a JPEG image"),
    (0, b"GIF8", "a GIF image"),
    (0, b"%PDF-", "a PDF document"),
    (0, b"PK\x03\x04", "a zip archive"),
    (0, b"PK\x05\x06", "a zip archive"),
    (0, b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"),
    (0, b"Rar!\x1a\x07", "a RAR archive"),
    (257, b"ustar", "a tar archive"),
    (0, b"\x7fELF", "an executable"),
    (0, b"SQLite format 3\x00", "an SQLite database"),
    (0, b"PAR1", "a Parquet file"),
    (0, b"ARROW1", "an Arrow file"),
    (0, b"\x93NUMPY", "a NumPy array"),
    (0, b"\x04\x22\x4d\x18", "lz4-compressed data"),
    (0, b"\xff\xfe", "UTF-16 text (save it as UTF-8)"),
    (0, b"\xfe\xff", "UTF-16 text (save it as UTF-8)"),
]
# Control bytes that plain text does hold: tab, line feed, vertical tab, form feed, carriage
# return, bell, backspace, DOS's end-of-file (0x1A) and escape.
TEXT_CONTROLS = b"\t\n\v\f\r\a\b\x1a\x1b"
NOT_CONTROL = bytes(b for b in range(256) if b >= 0x20 and b != 0x7F) + TEXT_CONTROLS
# More control bytes than this share of a file: not text (real books hold a handful).
MAX_CONTROL_SHARE = 0.01


def signature(head: bytes) -> str | None:
    """What a file whose first bytes are `head` is, when they are a known binary signature."""
    return next((kind for offset, magic, kind in SIGNATURES
                 if head[offset:offset + len(magic)] == magic), None)


class TextCheck:
    """Fed a file's bytes chunk by chunk; raises one BertkitError naming `name` when they are
    not text. `what` says what must be text, for the message."""

    def __init__(self, name: str, what: str):
        self.name, self.what = name, what
        self.size = 0
        self.controls = 0

    def refuse(self, kind: str):
        raise BertkitError(f"{self.name}: {kind}, not text ({self.what})")

    def feed(self, chunk: bytes) -> None:
        if self.size == 0 and (kind := signature(chunk[:512])):
            self.refuse(kind)
        if (nul := chunk.find(b"\x00")) >= 0:
            self.refuse(f"binary data (a NUL byte at byte {self.size + nul:,})")
        self.controls += len(chunk.translate(None, NOT_CONTROL))
        self.size += len(chunk)

    def finish(self) -> None:
        if self.controls > MAX_CONTROL_SHARE * self.size:
            self.refuse(f"binary data ({self.controls:,} control bytes in {self.size:,})")
