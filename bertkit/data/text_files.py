"""Benchmark files as text: UTF-8 (a byte-order mark, as MRPC's files or an editor write it,
is not an error), and one message naming the file and line when a byte is not UTF-8."""

from __future__ import annotations

from pathlib import Path

from bertkit.errors import BertkitError


def read_utf8(path: Path) -> str:
    raw = Path(path).read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise BertkitError(f"{path}, line {line}: not valid UTF-8 ({err.reason})") from None
