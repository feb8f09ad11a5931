"""The result cards' tables that bertkit-report prints, read from the cards themselves.

In a card (cards/*.md), a fenced block whose last command is `bertkit-report RECORDS ...`,
followed (blank lines between) by one or more tables, shows what that command prints: each
of those tables is a table of the report.md it writes (the one with the same header), line
for line. tests/reporting/test_cards_reproduce.py runs each command in-process on the
committed records and compares; after a change to the report's format, the cards are
rewritten from the report with

    python -m tests.card_tables --write
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.doc_commands import commands_in

REPO = Path(__file__).resolve().parent.parent
CARDS = sorted((REPO / "cards").glob("*.md"))
_FENCE = re.compile(r"^\s*(```|~~~)")


@dataclass(frozen=True)
class CardTable:
    """One bertkit-report command of a card and the tables the card shows under it."""

    card: Path
    line: int                       # the command's first line (1-based)
    args: tuple[str, ...]           # bertkit-report's arguments, as written
    tables: tuple[tuple[int, int], ...]  # (first line, last line + 1) of each table, 0-based

    @property
    def source(self) -> str:
        return f"{self.card.relative_to(REPO)}:{self.line}"

    def shown(self) -> list[str]:
        lines = self.card.read_text(encoding="utf-8").splitlines()
        return ["\n".join(lines[start:end]) for start, end in self.tables]


def _tables_from(lines: list[str], start: int) -> tuple[tuple[int, int], ...]:
    """The tables that follow line `start`, with nothing but blank lines between them."""
    found, index = [], start
    while True:
        while index < len(lines) and not lines[index].strip():
            index += 1
        if index >= len(lines) or not lines[index].startswith("|"):
            return tuple(found)
        end = index
        while end < len(lines) and lines[end].startswith("|"):
            end += 1
        found.append((index, end))
        index = end


def card_tables(card: Path) -> list[CardTable]:
    """Every fenced block of the card whose last line (comments aside) is a bertkit-report
    command and that a table follows."""
    lines = card.read_text(encoding="utf-8").splitlines()
    found, index = [], 0
    while index < len(lines):
        if not _FENCE.match(lines[index]):
            index += 1
            continue
        body_start = index + 1
        end = body_start
        while end < len(lines) and not _FENCE.match(lines[end]):
            end += 1
        logical = []
        for number in range(body_start, end):  # backslash-continued lines read as one
            text = lines[number]
            if not logical or not logical[-1][1].endswith("\\"):
                logical.append((number, text))
            else:
                logical[-1] = (logical[-1][0], logical[-1][1][:-1] + " " + text.strip())
        shown = [(number, text) for number, text in logical
                 if text.strip() and not text.lstrip().startswith("#")]
        commands = commands_in(shown[-1][1], f"{card.name}:{shown[-1][0] + 1}") if shown else []
        if commands and commands[-1].program == "bertkit-report":
            first, command = shown[-1][0], commands[-1]
            tables = _tables_from(lines, end + 1)
            if tables:
                found.append(CardTable(card, first + 1, command.args, tables))
        index = end + 1
    return found


def all_card_tables() -> list[CardTable]:
    return [table for card in CARDS for table in card_tables(card)]


def report_tables(args: tuple[str, ...]) -> dict[str, str]:
    """The tables of the report.md that `bertkit-report ARGS` writes, run in-process from the
    repository root (its --out, if any, replaced by a temporary folder), by header row."""
    from bertkit.reporting.cli import main

    with tempfile.TemporaryDirectory() as out, contextlib.chdir(REPO), \
            contextlib.redirect_stdout(io.StringIO()):
        code = main([*args, "--out", out])
        assert code == 0, f"bertkit-report {' '.join(args)} exited {code}"
        report = (Path(out) / "report.md").read_text(encoding="utf-8").splitlines()
    tables = {}
    for start, end in _tables_from_all(report):
        tables[_header(report[start])] = "\n".join(report[start:end])
    return tables


def _tables_from_all(lines: list[str]) -> list[tuple[int, int]]:
    spans, index = [], 0
    while index < len(lines):
        if lines[index].startswith("|"):
            end = index
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            spans.append((index, end))
            index = end
        else:
            index += 1
    return spans


def _header(row: str) -> str:
    """A table's header row with its padding removed: the report pads the Results table."""
    return "|".join(cell.strip() for cell in row.split("|"))


def regenerate(card: Path) -> int:
    """Rewrites each of the card's report tables with what its command prints now; returns
    how many changed."""
    lines = card.read_text(encoding="utf-8").splitlines()
    changed = 0
    for entry in reversed(card_tables(card)):
        printed = report_tables(entry.args)
        for start, end in reversed(entry.tables):
            header = _header(lines[start])
            if header not in printed:
                raise SystemExit(f"{entry.source}: the report prints no table with the header "
                                 f"{lines[start]!r}")
            new = printed[header].splitlines()
            if new != lines[start:end]:
                lines[start:end] = new
                changed += 1
    card.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return changed


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true",
                        help="rewrite the cards' report tables from the committed records")
    if parser.parse_args().write:
        for card in CARDS:
            if card_tables(card):
                print(f"{card.relative_to(REPO)}: {regenerate(card)} table(s) rewritten")
    else:
        for entry in all_card_tables():
            print(f"{entry.source}: bertkit-report {' '.join(entry.args)} "
                  f"({len(entry.tables)} table(s))")
