"""bertkit-report OUTPUTS_DIR [--out REPORT_DIR] [--compare GLOB_A GLOB_B] [--decimals N]

Collects the finetuning runs under OUTPUTS_DIR and writes report.md, results.csv,
report.json and per-task figures into REPORT_DIR (default OUTPUTS_DIR/report).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from bertkit.errors import BertkitError
from bertkit.report_writer import build_report, write_report

PROG = "bertkit-report"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Tables, statistics and figures of finetuning runs.")
    parser.add_argument("outputs_dir", type=Path, metavar="OUTPUTS_DIR",
                        help="a run directory or any parent of run directories")
    parser.add_argument("--out", type=Path, default=None, metavar="REPORT_DIR",
                        help="where to write the report (default: OUTPUTS_DIR/report)")
    parser.add_argument("--compare", nargs=2, metavar=("GLOB_A", "GLOB_B"), default=None,
                        help="significance of B vs A; globs match run directories relative "
                             "to OUTPUTS_DIR (fnmatch, '*' also matches '/')")
    parser.add_argument("--decimals", type=int, default=1, metavar="N",
                        help="decimals shown in report.md (default 1)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out_dir = args.out if args.out is not None else args.outputs_dir / "report"
    try:
        report = build_report(args.outputs_dir, compare=args.compare, decimals=args.decimals)
        written = write_report(report, out_dir)
    except BertkitError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    print(report["table_markdown"], end="")
    if report["failed"]:
        print(f"\n{len(report['failed'])} failed job(s), listed in report.md")
    print(f"\nwrote {len(written)} files to {out_dir}:")
    for path in written:
        print(f"  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
