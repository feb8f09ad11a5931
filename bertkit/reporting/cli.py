"""bertkit-report OUTPUTS_DIR [--out REPORT_DIR] [--compare A B ...] [--pool] [--decimals N]
                  [--source {auto,files,wandb}] [--reference KEY ...] [--references FILE]
bertkit-report SWEEP_DIR --wandb-workspace ENTITY/PROJECT [--dry-run] [--workspace-name NAME]
                  [--workspace-layout FILE] [--out REPORT_DIR]

Collects the finetuning and pretraining runs under OUTPUTS_DIR (their metrics.json, or the
W&B run logs of finetunes whose metrics.json is gone) and writes report.md, results.csv,
pretraining.csv, report.json and per-task figures into REPORT_DIR (default
OUTPUTS_DIR/report), with published scores as reference rows and each system's distance to
them. With --wandb-workspace: builds the sweep's W&B
workspace instead (bertkit.reporting.wandb_workspace), writes its spec to
REPORT_DIR/wandb_workspace.json, and saves it to W&B unless --dry-run.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from bertkit.data.atomic_files import write_json_atomic
from bertkit.errors import BertkitError
from bertkit.reporting.collect import SOURCES
from bertkit.reporting.sections import console_comparisons
from bertkit.reporting.wandb_workspace import (
    WORKSPACE_FILE,
    build_workspace,
    load_layout,
    parse_target,
    plan_workspace,
    read_sweep,
    save_workspace,
    workspace_view,
)
from bertkit.reporting.writer import Significance, build_report, write_report
from bertkit.secret_masking import mask_secrets

PROG = "bertkit-report"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Tables, statistics and figures of finetuning and pretraining runs.")
    parser.add_argument("outputs_dir", type=Path, metavar="OUTPUTS_DIR",
                        help="a run directory or any parent of run directories")
    parser.add_argument("--out", type=Path, default=None, metavar="REPORT_DIR",
                        help="where to write the report (default: OUTPUTS_DIR/report)")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"), default=None,
                        action="append",
                        help="significance of B vs A. Each side selects runs by settings, "
                             "KEY=VALUE items separated by spaces or commas in one argument "
                             "('finetuning=llrd', 'learning_rate=2e-5 seed=1'; KEY: any "
                             "setting of the runs' configs, its full key, a group for its "
                             "choice or an unambiguous suffix; VALUE as a Hydra override "
                             "reads it), or is a glob over run directories relative to "
                             "OUTPUTS_DIR (fnmatch, '*' also matches '/'). Repeatable "
                             "(e.g. each arm against one baseline): Holm's p and ASO's "
                             "correction then count every comparison of the table")
    parser.add_argument("--pool", action="store_true",
                        help="with --compare of settings: pool each side's runs across the "
                             "levels of the other settings the rows differ in (one test) "
                             "instead of one test per level (static vs dynamic masking at "
                             "objective=mlm and at objective=mlm_nsp)")
    parser.add_argument("--paired", action="store_true",
                        help="with --compare: the paired t-test over the seeds both groups ran "
                             "(e.g. two checkpoints finetuned with the same seeds) instead of "
                             "Welch's test")
    parser.add_argument("--confidence", type=float, default=0.95, metavar="LEVEL",
                        help="with --compare: level of the confidence interval (default 0.95)")
    defaults = Significance()
    parser.add_argument("--aso-threshold", type=float, default=defaults.aso_threshold,
                        metavar="EPS", help="with --compare: call B better than A when ASO's "
                        f"ε_min is below EPS (default {defaults.aso_threshold:g}, Ulmer et al. "
                        "2022)")
    parser.add_argument("--detect", type=float, default=defaults.detect, metavar="D",
                        help="with --compare: the seeds-needed line is for a difference of D "
                             f"displayed points (default {defaults.detect:g})")
    parser.add_argument("--power", type=float, default=defaults.power, metavar="P",
                        help=f"with --compare: power of the seeds-needed line (default "
                             f"{defaults.power:g})")
    parser.add_argument("--bootstrap", type=int, default=defaults.resamples, metavar="N",
                        help=f"with --compare: bootstrap resamples of the difference's "
                             f"interval (default {defaults.resamples})")
    parser.add_argument("--stats-seed", type=int, default=defaults.seed, metavar="SEED",
                        help="with --compare: seed of the bootstrap and of ASO (default "
                             f"{defaults.seed})")
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
    workspace = parser.add_argument_group("W&B workspace")
    workspace.add_argument("--wandb-workspace", default=None, metavar="ENTITY/PROJECT",
                           help="build a W&B workspace for the sweep's runs (grouped by grid "
                                "point, seeds aggregated) instead of the report")
    workspace.add_argument("--dry-run", action="store_true",
                           help="with --wandb-workspace: write the workspace's spec (JSON) only, "
                                "without saving it to W&B")
    workspace.add_argument("--workspace-name", default=None, metavar="NAME",
                           help="the workspace's name (default: bertkit: <the runs' groups>)")
    workspace.add_argument("--workspace-layout", type=Path, default=None, metavar="FILE",
                           help="the panels (default: bertkit/reporting/wandb_workspace.yaml)")
    return parser.parse_args(argv)


def build_wandb_workspace(args: argparse.Namespace, out_dir: Path) -> int:
    plan = plan_workspace(read_sweep(args.outputs_dir), *parse_target(args.wandb_workspace),
                          name=args.workspace_name, layout=load_layout(args.workspace_layout))
    workspace = build_workspace(plan)
    spec = {"entity": plan.entity, "project": plan.project, "name": plan.name,
            "groups": plan.groups, "sweep_tag": plan.sweep_tag, "grid_keys": plan.grid_keys,
            "left_out": plan.left_out, "view": workspace_view(workspace)}
    path = write_json_atomic(out_dir / WORKSPACE_FILE, mask_secrets(spec))
    panels = sum(len(section["panels"]) for section in plan.sections)
    print(f"W&B workspace {plan.name!r} for {plan.entity}/{plan.project}: runs of group(s) "
          f"{', '.join(plan.groups)}, grouped by {', '.join(['group', *plan.grid_keys])} "
          f"(seeds aggregated); {panels} panels and a parallel-coordinates panel")
    for title in plan.left_out:
        print(f"  left out (no run logged its keys): {title}")
    print(f"spec: {path}")
    if not args.dry_run:
        print(f"saved: {save_workspace(workspace)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out_dir = args.out if args.out is not None else args.outputs_dir / "report"
    if args.wandb_workspace is not None:
        try:
            return build_wandb_workspace(args, out_dir)
        except BertkitError as err:
            print(f"{PROG}: error: {err}", file=sys.stderr)
            return 2
    try:
        report = build_report(args.outputs_dir, compare=args.compare, decimals=args.decimals,
                              source=args.source, references_file=args.references,
                              reference_keys=args.reference, paired=args.paired,
                              confidence=args.confidence, significance=Significance(
                                  aso_threshold=args.aso_threshold, detect=args.detect,
                                  power=args.power, resamples=args.bootstrap,
                                  seed=args.stats_seed), pool=args.pool)
        written = write_report(report, out_dir)
    except BertkitError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    print(report["table_markdown"], end="")
    if report["pretraining"]["systems"]:
        print(("\n" if report["table_markdown"] else "") + "Pretraining (held-out scores):")
        print(report["pretraining"]["table_markdown"], end="")
    for line in console_comparisons(report):
        print(line)
    if report["failed"]:
        print(f"\n{len(report['failed'])} failed job(s), listed in report.md")
    print(f"\nwrote {len(written)} files to {out_dir}:")
    for path in written:
        print(f"  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
