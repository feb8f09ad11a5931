"""How every benchmark hands over its result, written once: the JSON written atomically into
the run directory, then the table that names it printed; and the table's small pieces."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from bertkit.data.atomic_files import write_json_atomic


def publish(result: dict, path: Path, table: Callable[[dict, Path], str]) -> Path:
    """The result written to path (a reader never sees half a file), then table(result, path)
    printed."""
    written = write_json_atomic(path, result)
    print(table(result, written))
    return written


def optional(value: float | None, spec: str) -> str:
    """A figure a device may lack (MFU on a CPU), formatted, or n/a."""
    return "n/a" if value is None else format(value, spec)


def markdown_head(*columns: str) -> list[str]:
    """A markdown table's header line and the separator line under it."""
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def markdown_row(*cells: str) -> str:
    """A markdown table's row."""
    return "| " + " | ".join(cells) + " |"
