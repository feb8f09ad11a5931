"""bertkit-report OUTPUTS_DIR [--out REPORT_DIR] [--compare GLOB_A GLOB_B] [--decimals N]
                  [--source {auto,files,wandb}] [--reference KEY ...] [--references FILE]

Collects the finetuning runs under OUTPUTS_DIR (their metrics.json, or the W&B run logs of
runs whose metrics.json is gone) and writes report.md, results.csv, report.json and per-task
figures into REPORT_DIR (default OUTPUTS_DIR/report), with published scores as reference
rows and each system's distance to them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from bertkit.errors import BertkitError
from bertkit.reporting.collect import SOURCES
from bertkit.reporting.writer import build_report, write_report

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
    parser.add_argument("--paired", action="store_true",
                        help="with --compare: the paired t-test over the seeds both groups ran "
                             "(e.g. two checkpoints finetuned with the same seeds) instead of "
                             "Welch's test")
    parser.add_argument("--confidence", type=float, default=0.95, metavar="LEVEL",
                        help="with --compare: level of the confidence interval (default 0.95)")
    parser.add_argument("--decimals", type=int, default=1, metavar="N",
                        help="decimals shown in report.md (default 1)")
    parser.add_argument("--source", choices=SOURCES, default="auto",
                        help="where runs are read from: auto (default) metrics.json where a "
                             "run directory has one, else the run's W&B log (wandb/offline-"
                             "run-*/run-*.wandb); files: metrics.json and failed.json only; "
                             "wandb: the W&B run logs only")
    parser.add_argument("--reference", action="append", default=None, metavar="KEY",
                        help="a published score to show and measure against (a key of the "
                             "references file; repeatable). Default: every reference whose "
                             "models include a system's model; 'none': no reference")
    parser.add_argument("--references", type=Path, default=None, metavar="FILE",
                        help="the references file (default: bertkit's "
                             "bertkit/reporting/published_scores.yaml)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out_dir = args.out if args.out is not None else args.outputs_dir / "report"
    try:
        report = build_report(args.outputs_dir, compare=args.compare, decimals=args.decimals,
                              source=args.source, references_file=args.references,
                              reference_keys=args.reference, paired=args.paired,
                              confidence=args.confidence)
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
