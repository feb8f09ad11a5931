"""What is not text: a known file signature, a NUL byte, or many control bytes. Text read
with a Latin-1 fallback decodes any byte, so without this check an image or an archive would
be read as prose and trained on without a word."""

from __future__ import annotations

from bertkit.errors import BertkitError

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
