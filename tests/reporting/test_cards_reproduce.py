"""The result cards reproduce with the tool: each card table drawn from run records is what
bertkit-report prints on the records committed beside the cards, with the command the card
shows right above it (tests/card_tables.py reads those pairs from the cards), and the records
are ones the report can pool: every arm one row of all its seeds, no machine paths."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from bertkit.reporting.cli import parse_args
from bertkit.reporting.collect import collect_runs
from bertkit.reporting.identity import RowSplit
from tests.card_tables import REPO, _header, all_card_tables, report_tables

CARDS = REPO / "cards"
PAIRS = all_card_tables()
RECORDS = sorted(CARDS.rglob("metrics.json"))
# Where the records of the finetuning card's arms are: <task>/<arm>/seed_<k>/.
ARMS = CARDS / "finetuning" / "runs"


def _records_dir(entry) -> Path:
    return (REPO / parse_args(entry.args).outputs_dir).resolve()


def test_every_record_is_reported_by_a_card_command():
    assert len(RECORDS) >= 75
    assert PAIRS, "no card shows a bertkit-report command followed by its table"
    reported = {_records_dir(entry) for entry in PAIRS}
    for directory in reported:  # a command on runs that are not committed could not rerun
        assert directory.is_dir() and directory.is_relative_to(CARDS.resolve()), directory
    unreported = [str(r.relative_to(REPO)) for r in RECORDS
                  if not any(r.resolve().is_relative_to(d) for d in reported)]
    assert not unreported, f"records no card's report command reads: {unreported[:5]}"


@pytest.mark.parametrize("task", ["mrpc", "stsb"])
def test_each_arm_is_one_row_of_all_its_seeds(task):
    """The report keys rows on every recorded setting: records of one arm that differ in a
    path (task.data_dir spelled two ways) or lack a setting others record split the arm."""
    runs, failed = collect_runs(ARMS / task)
    assert not failed
    split = RowSplit.of(runs)
    assert split.unknown == () and split.unrecorded_runs == 0
    rows = Counter(split.name(run) for run in runs)
    arms = {path.name for path in (ARMS / task).iterdir() if path.is_dir()}
    assert len(rows) == len(arms)
    assert set(rows.values()) == {5}, rows
    for run in runs:
        assert split.name(run).endswith(f"finetuning={run.run_dir.parent.name}")
        assert run.settings.get("data.fingerprint"), run.run_dir


def test_records_name_no_machine_paths():
    found = []
    for path in RECORDS:
        for text in (path.read_text(encoding="utf-8"),
                     path.with_name("config.yaml").read_text(encoding="utf-8")):
            values = [line for line in text.splitlines() if "/work/" in line
                      or "/root/" in line or "/home/" in line or ": /" in line
                      or '": "/' in line]
            found += [f"{path.parent.relative_to(REPO)}: {line.strip()}" for line in values]
    assert not found, found[:5]
    details = json.loads(RECORDS[0].read_text(encoding="utf-8"))["details"]
    assert set(details["input_fingerprints"]) == {"model.name_or_path", "model.tokenizer"}


@pytest.mark.slow  # the report's statistics: ASO over ten arms takes minutes on 2 cores
@pytest.mark.parametrize("entry", PAIRS, ids=lambda entry: entry.source)
def test_card_table_is_what_its_command_prints(entry):
    printed = report_tables(entry.args)
    for shown in entry.shown():
        header = _header(shown.splitlines()[0])
        assert header in printed, f"{entry.source}: the report prints no table {header!r}"
        assert shown == printed[header], (
            f"{entry.source}: the card's table differs from what the command prints now; "
            f"`python -m tests.card_tables --write` rewrites it\n{printed[header]}")
