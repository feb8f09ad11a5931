"""Assemble bertkit-report from the runs on disk and the pure functions of the other modules.

build_report reads the runs (collect.py) and computes every number (statistics.py,
tables.py); write_report writes report.md (sections.py), results.csv, report.json and the
figures (plots.py).

A "system", a row of the table, is every setting in which the runs of a task differ, the
seed, result-neutral settings and the paper's grid aside (identity.py): runs that differ in
anything else are never pooled as seeds. For each system and task the grid point
(learning_rate, train_batch_size, num_train_epochs) is the one with the best mean main_value
over seeds on dev (best_grid_point), and the cell summarizes the seeds there.
Scores of a task whose main values are all within [-1, 1] (fractions, as GLUE writes them)
are shown ×100; others (SQuAD, already in percent) as they are. report.json keeps the raw
values next to the scale.

Published scores (bertkit/reporting/published_scores.yaml, see references.py) are added
as rows of the table and each system's mean is measured against them ("Distance to
reference"), with the reference's split said: the GLUE numbers of the papers are test-server
scores, bertkit's are dev scores. Runs that successive halving stopped part-way are listed,
never ranked; each sweep's halving.json becomes a section of its own (halving.py).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bertkit.data.atomic_files import write_json_atomic, write_text_atomic
from bertkit.errors import BertkitError
from bertkit.reporting.collect import collect_runs
from bertkit.reporting.halving_section import collect_halving
from bertkit.reporting.identity import RowSplit
from bertkit.reporting.plots import plot_expected_max, plot_seeds
from bertkit.reporting.references import (
    choose_references,
    default_references_path,
    load_references,
    matches_model,
)
from bertkit.reporting.results import GRID_KEYS, RunResult
from bertkit.reporting.sections import one_line, render_markdown, safe_name
from bertkit.reporting.selection import resolve_side
from bertkit.reporting.statistics import (
    aso_epsilon,
    best_grid_point,
    bootstrap_difference_ci,
    compare_groups,
    expected_max_curve,
    holm_adjust,
    seeds_needed,
    tied,
)
from bertkit.reporting.tables import column_header, glue_table_csv, glue_table_markdown
from bertkit.secret_masking import mask_secrets

__all__ = ["build_report", "render_markdown", "write_report"]


def relative_dir(path: Path, root: Path) -> str:
    try:
        return Path(path).relative_to(root).as_posix()
    except ValueError:
        return Path(path).as_posix()


def _task_scale(runs: Sequence[RunResult]) -> float:
    return 100.0 if all(abs(r.main_value) <= 1.0 for r in runs) else 1.0


def _best(runs: Sequence[RunResult], root: Path, split: RowSplit | None = None) -> dict:
    """The best grid point of one task's runs and the seeds there (raw values). With split,
    runs of several rows (a --compare glob) compete as configurations, row and grid point
    together: the seeds pooled are always of one configuration."""
    def configuration(run: RunResult) -> tuple:
        return (split.key(run) if split else (), run.grid_point)

    point, summary = best_grid_point(runs, key=configuration)
    chosen = sorted((r for r in runs if configuration(r) == point),
                    key=lambda r: (r.seed, str(r.run_dir)))
    return {
        "grid_point": dict(zip(GRID_KEYS, chosen[0].grid_point, strict=True)),
        "grid_points_tried": len({r.grid_point for r in runs}),
        "runs_tried": len(runs),
        "summary": summary,
        "seeds": [r.seed for r in chosen],
        "values": [r.main_value for r in chosen],
        # What each seed really trained (None: not recorded): below the grid point's
        # num_train_epochs when max_steps or a stop ended it first.
        "epochs_trained": [r.epochs_trained for r in chosen],
        "run_dirs": [relative_dir(r.run_dir, root) for r in chosen],
    }


NOT_FOUND = {
    "files": "no metrics.json with a main_metric",
    "wandb": "no finished W&B run log",
    "auto": "no metrics.json with a main_metric, no finished W&B run log",
}


@dataclass(frozen=True)
class Significance:
    """How --compare tests B against A (bertkit-report's options of the same names)."""

    paired: bool = False
    confidence: float = 0.95
    aso_threshold: float = 0.2  # B is called better when ASO's ε_min is below it
    detect: float = 1.0  # the difference, in displayed points, the seeds-needed line is for
    power: float = 0.8
    resamples: int = 10000  # bootstrap resamples of the CI
    aso_iterations: int = 1000  # deepsig's bootstrap iterations
    seed: int = 0  # of the bootstrap and ASO: a report is reproducible


def build_report(
    root: str | Path,
    compare: Sequence[Sequence[str]] | None = None,
    decimals: int = 1,
    source: str = "auto",
    references_file: str | Path | None = None,
    reference_keys: Sequence[str] | None = None,
    paired: bool = False,
    confidence: float = 0.95,
    significance: Significance | None = None,
) -> dict:
    """Everything the report shows, as plain data (the content of report.json).

    compare: (A, B) pairs, one per --compare, each side a glob over run directories or
    KEY=VALUE settings (selection.py); Holm's adjustment and ASO's
    Bonferroni correction count every task of every pair, so a table of arms against one
    baseline is corrected as a whole. paired / confidence: of those tests; significance: the
    rest of their settings (ASO threshold, the difference the seeds-needed line is for, ...),
    defaults if None.

    source: where runs are read from (collect.SOURCES). references_file: the published
    scores (default: the packaged bertkit/reporting/published_scores.yaml); reference_keys:
    the entries to show (None: those whose models match a system's model; ["none"]: none).
    """
    root = Path(root)
    if decimals < 0:
        raise BertkitError(f"--decimals {decimals}: must be 0 or more")
    runs, failed = collect_runs(root, source=source)
    # Runs that successive halving stopped part-way hold partial scores: they are counted and
    # listed, never chosen as a task's best configuration.
    stopped = [r for r in runs if not r.complete]
    runs = [r for r in runs if r.complete]
    if not runs:
        raise BertkitError(_no_runs_message(root, source, stopped, failed))
    tasks = sorted({r.task for r in runs})
    task_info = _task_info(runs, tasks)
    split = RowSplit.of(runs)
    system_rows = _system_rows(runs, tasks, root, split)
    references = _references(system_rows, task_info, references_file, reference_keys)
    rows = _table_rows(system_rows, task_info, references)
    metrics = {t: info["metric"] for t, info in task_info.items()}
    report = {
        "outputs_dir": str(root),
        "decimals": decimals,
        "n_runs": len(runs),
        "source": source,
        "runs_by_source": {name: sum(r.source == name for r in runs)
                           for name in sorted({r.source for r in runs})},
        "tasks": task_info,
        "rows_split_by": _split_facts(split, runs),
        "systems": system_rows,
        "references": references,
        "table_markdown": glue_table_markdown(rows, tasks, metrics, decimals=decimals,
                                              scale=1.0),
        "table_csv": glue_table_csv(rows, tasks, scale=1.0),
        "failed": [{"run_dir": relative_dir(f.run_dir, root), "error": f.error}
                   for f in failed],
        "comparisons": [],
        "stopped": [relative_dir(r.run_dir, root) for r in stopped],
        "halving": collect_halving(root),
    }
    if compare:
        settings = dataclasses.replace(significance or Significance(), paired=paired,
                                       confidence=confidence)
        report["comparisons"] = _compare_all(runs, root, compare, task_info, settings, split)
    return report


def _table_rows(system_rows: list[dict], task_info: dict, references: dict) -> dict:
    """The results table's rows: each system's seeds at its best grid points, shown scaled,
    then each reference with a task in the table as a row of one number per task."""
    rows = {s["system"]: {t: [v * task_info[t]["scale"] for v in b["values"]]
                          for t, b in s["tasks"].items()} for s in system_rows}
    for reference in references["chosen"]:
        if reference["tasks_shown"]:
            rows[reference["row"]] = {t: [reference["scores"][t]]
                                      for t in reference["tasks_shown"]}
    return rows


def _no_runs_message(root: Path, source: str, stopped: list, failed: list) -> str:
    """One line that says why there is nothing to report, naming the first failure."""
    message = f"{root}: no finetuning runs found ({NOT_FOUND.get(source, source)})"
    if stopped:
        message += f"; {len(stopped)} run(s) stopped part-way by successive halving"
    if failed:
        first = failed[0]
        message += (f"; {len(failed)} failed job(s), the first "
                    f"{relative_dir(first.run_dir, root)}: {one_line(first.error)}")
    return message


def _task_info(runs: Sequence[RunResult], tasks: list[str]) -> dict:
    """Per task: its main metric(s), the scale its scores are shown at, its column header."""
    info = {}
    for task in tasks:
        of_task = [r for r in runs if r.task == task]
        metric = "/".join(sorted({r.main_metric for r in of_task}))
        info[task] = {"metric": metric, "scale": _task_scale(of_task),
                      "header": column_header(task, metric)}
    return info


def _split_facts(split: RowSplit, runs: Sequence[RunResult]) -> dict:
    """What report.md says of its rows: the settings that split them, those it cannot tell,
    and where the runs' settings were read from."""
    sources: dict[str, int] = {}
    for run in runs:
        sources[run.settings_source] = sources.get(run.settings_source, 0) + 1
    return {"keys": list(split.keys), "common": dict(split.common),
            "unknown": list(split.unknown),
            "runs_without_unknown": split.unrecorded_runs,
            "settings_sources": dict(sorted(sources.items()))}


def _system_rows(runs: Sequence[RunResult], tasks: list[str], root: Path,
                 split: RowSplit) -> list[dict]:
    """One entry per system: per task, its best grid point (_best) and expected-max curve."""
    systems: dict[str, list[RunResult]] = {}
    for run in runs:
        systems.setdefault(split.name(run), []).append(run)
    system_rows = []
    for name in sorted(systems):
        per_task = {}
        for task in tasks:
            of_task = [r for r in systems[name] if r.task == task]
            if of_task:
                best = _best(of_task, root)
                best["expected_max"] = [float(v) for v in
                                        expected_max_curve([r.main_value for r in of_task])]
                per_task[task] = best
        first = systems[name][0]
        system_rows.append({"system": name, "recipe": first.recipe, "model": first.model,
                            "settings": split.differing(first), "tasks": per_task})
    return system_rows


def _references(system_rows: list[dict], task_info: dict, references_file,
                reference_keys: Sequence[str] | None) -> dict:
    """The chosen references, their table rows and every system's distance to them.

    A reference is measured against every system when named with --reference, else against
    the systems whose model it lists. Only tasks in the table count, and only where the
    reference's metric is the runs' main metric (a run with another task.main_metric is not
    comparable).
    """
    keys = list(reference_keys) if reference_keys is not None else None
    if keys == ["none"]:
        return {"file": None, "requested": keys, "chosen": [], "distances": [], "skipped": []}
    path = Path(references_file) if references_file is not None else default_references_path()
    chosen, named = choose_references(load_references(path), keys,
                                      [s["model"] for s in system_rows])
    entries, distances, skipped = [], [], []
    for reference in chosen:
        systems = [s for s in system_rows if named or matches_model(reference, s["model"])]
        shown = []
        for task, info in task_info.items():
            if task not in reference.scores:
                continue
            if reference.metrics[task] != info["metric"]:
                skipped.append({"reference": reference.key, "task": task,
                                "reason": f"the reference is {reference.metrics[task]}, the "
                                          f"runs' main metric is {info['metric']}"})
                continue
            shown.append(task)
            value = reference.scores[task]
            for system in systems:
                best = system["tasks"].get(task)
                if best is None:
                    continue
                mean = best["summary"]["mean"] * info["scale"]
                distances.append({
                    "system": system["system"], "reference": reference.key,
                    "reference_label": reference.label, "task": task, "metric": info["metric"],
                    "reference_split": reference.split, "run_split": "dev",
                    "system_mean": mean, "n_seeds": best["summary"]["n"],
                    "reference_value": value, "difference": mean - value,
                    "reference_note": reference.notes.get(task, "")})
        entries.append({**reference.as_dict(), "row": reference.label, "tasks_shown": shown,
                        "systems": [s["system"] for s in systems]})
    return {"file": str(path), "requested": keys, "chosen": entries, "distances": distances,
            "skipped": skipped}


def _compare_all(runs, root: Path, pairs: Sequence[Sequence[str]], task_info: dict,
                 settings: Significance, split: RowSplit) -> list[dict]:
    """Per pair and task, B against A: Welch's t-test (paired: the paired t-test over the
    seeds both groups ran), ASO's ε_min, a bootstrap CI of the difference, Holm-adjusted
    p-values over every (pair, task) of the report, and the seeds per arm needed to detect
    settings.detect points.

    Each group's values are the seeds of that group's best configuration on dev for the task
    (its row's settings and grid point, as the table's rows): a glob that covers a whole grid
    compares the configurations one would report, and one that covers several rows never
    pools them.
    """
    gathered = [_tests(runs, root, glob_a, glob_b, settings, split)
                for glob_a, glob_b in pairs]
    holm = holm_adjust({(i, task): test[4]["p_value"]
                        for i, (_, _, tests, _) in enumerate(gathered)
                        for task, test in tests.items()})  # one family: every row
    comparisons = []
    for i, ((glob_a, glob_b), (sides, groups, tests, skipped)) in enumerate(
            zip(pairs, gathered, strict=True)):
        results = {task: {"a": best_a, "b": best_b, "scale": task_info[task]["scale"], **stats,
                          "p_holm": holm[(i, task)],
                          **_beyond_t(values_a, values_b, stats, task_info[task]["scale"],
                                      settings, len(holm))}
                   for task, (best_a, best_b, values_a, values_b, stats) in tests.items()}
        comparisons.append({"glob_a": glob_a, "glob_b": glob_b,
                            # The sides as the table names them; their settings when they
                            # are KEY=VALUE selections (None: a glob), full keys.
                            "label_a": sides["a"].label, "label_b": sides["b"].label,
                            "describe_a": sides["a"].describe(),
                            "describe_b": sides["b"].describe(),
                            "selection_a": sides["a"].settings,
                            "selection_b": sides["b"].settings,
                            **dataclasses.asdict(settings), "n_runs_a": len(groups["a"]),
                            "n_runs_b": len(groups["b"]), "tasks": results,
                            "skipped": skipped})
    return comparisons


def _tests(runs, root: Path, glob_a: str, glob_b: str, settings: Significance,
           split: RowSplit):
    """One pair's sides (selection.Side) and groups, its t-tests by task (the best grid
    points, their values and compare_groups' result) and the tasks it could not test, with
    why."""
    groups, sides = {}, {}
    for label, text in (("a", glob_a), ("b", glob_b)):
        sides[label], groups[label] = resolve_side(text, runs, root, relative_dir)
    tests, skipped = {}, {}
    for task in sorted({r.task for r in groups["a"]} & {r.task for r in groups["b"]}):
        best_a, best_b = (_configuration([r for r in groups[g] if r.task == task], root, split)
                          for g in ("a", "b"))
        try:
            values_a, values_b = best_a["values"], best_b["values"]
            if settings.paired:  # by seed: the same seed of A and of B form a pair
                values_a = dict(zip(best_a["seeds"], values_a, strict=True))
                values_b = dict(zip(best_b["seeds"], values_b, strict=True))
            tests[task] = (best_a, best_b, values_a, values_b, compare_groups(
                values_a, values_b, confidence=settings.confidence, paired=settings.paired))
        except BertkitError as err:
            skipped[task] = str(err)
    return sides, groups, tests, skipped


def _configuration(runs: Sequence[RunResult], root: Path, split: RowSplit) -> dict:
    """_best over a --compare group: its best configuration, named as its table row, and how
    many rows the group spans (more than one: the others were not pooled in)."""
    best = _best(runs, root, split)
    chosen = next(r for r in runs if relative_dir(r.run_dir, root) == best["run_dirs"][0])
    return {**best, "system": split.name(chosen),
            "rows_in_group": len({split.key(r) for r in runs})}


def _beyond_t(values_a, values_b, stats: dict, scale: float, settings: Significance,
              comparisons: int) -> dict:
    """ASO, the bootstrap interval and the seeds-needed line of one task's comparison. Tied
    groups (the same scores) are no difference, said so: ASO is not asked (its ε_min would
    read 1 both ways, and deepsig warns of a division by zero)."""
    same = tied(values_a, values_b)
    if settings.paired:  # compare_groups checked that the seeds match
        keys = sorted(values_a)
        values_a, values_b = [values_a[k] for k in keys], [values_b[k] for k in keys]
    values_a, values_b = list(values_a), list(values_b)
    # Both directions: ε_min near 1 only says B is not better; whether A is better (a method
    # that hurts) is the test with the roles swapped.
    epsilon, epsilon_a = (None, None) if same else (
        aso_epsilon(x, y, confidence=settings.confidence, num_comparisons=comparisons,
                    seed=settings.seed, bootstrap_iterations=settings.aso_iterations)
        for x, y in ((values_a, values_b), (values_b, values_a)))
    low, high = bootstrap_difference_ci(values_a, values_b, settings.confidence,
                                        paired=settings.paired, resamples=settings.resamples,
                                        seed=settings.seed)
    differences = np.subtract(values_b, values_a) if settings.paired else None
    needed = seeds_needed(
        float(np.std(values_a, ddof=1)), float(np.std(values_b, ddof=1)),
        settings.detect / scale, alpha=1 - settings.confidence, power=settings.power,
        paired_std=float(np.std(differences, ddof=1)) if differences is not None else None)
    return {"tied": same, "aso_epsilon": epsilon, "aso_comparisons": comparisons,
            "b_better_by_aso": not same and epsilon < settings.aso_threshold,
            "aso_epsilon_a_over_b": epsilon_a,
            "a_better_by_aso": not same and epsilon_a < settings.aso_threshold,
            "bootstrap_low": low, "bootstrap_high": high, "seeds_needed": needed}


def _json_safe(value):
    """nan (a std of one seed, a p-value without variance) as null: report.json stays JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def write_report(report: dict, out_dir: str | Path) -> list[Path]:
    """Write every file of the report into out_dir; returns their paths. Secrets masked: the
    runs it reads may have been written before bertkit masked them."""
    out_dir = Path(out_dir)
    report = mask_secrets(report)
    written = [write_text_atomic(out_dir / "report.md", render_markdown(report)),
               write_text_atomic(out_dir / "results.csv", report["table_csv"]),
               write_json_atomic(out_dir / "report.json", _json_safe(report))]
    for task, info in report["tasks"].items():
        scale = info["scale"]
        curves, seeds = {}, {}
        for system in report["systems"]:
            best = system["tasks"].get(task)
            if best is not None:
                curves[system["system"]] = [v * scale for v in best["expected_max"]]
                seeds[system["system"]] = [v * scale for v in best["values"]]
        written.append(plot_expected_max(curves, out_dir / f"expected_max_{safe_name(task)}.png",
                                         info["header"], info["metric"]))
        written.append(plot_seeds(seeds, out_dir / f"seeds_{safe_name(task)}.png",
                                  f"{info['header']}: seeds at the best grid point",
                                  info["metric"]))
    return written
