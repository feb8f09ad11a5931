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
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bertkit.data.atomic_files import write_json_atomic, write_text_atomic
from bertkit.errors import BertkitError
from bertkit.reporting.collect import collect
from bertkit.reporting.halving_section import collect_halving
from bertkit.reporting.identity import RowSplit
from bertkit.reporting.plots import plot_expected_max, plot_seeds
from bertkit.reporting.pretraining_section import (
    HIGHER_IS_BETTER,
    METRIC_LABELS,
    metric_scale,
    pretraining_csv,
    pretraining_rows,
    pretraining_table,
)
from bertkit.reporting.references import (
    choose_references,
    default_references_path,
    load_references,
    matches_model,
)
from bertkit.reporting.results import GRID_KEYS, PRETRAINING_TASK, PretrainingRun, RunResult
from bertkit.reporting.sections import at_level, one_line, render_markdown, safe_name
from bertkit.reporting.selection import Side, resolve_side
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

PRETRAINING_CSV = "pretraining.csv"  # the pretraining table, beside results.csv


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
    "files": "no metrics.json",
    "wandb": "no finished W&B run log",
    "auto": "no metrics.json, no finished W&B run log",
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
    pool: bool = False  # pool a factorial design's levels instead of a test per level


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
    pool: bool = False,
) -> dict:
    """Everything the report shows, as plain data (the content of report.json).

    compare: (A, B) pairs, one per --compare, each side a glob over run directories or
    KEY=VALUE settings (selection.py); Holm's adjustment and ASO's
    Bonferroni correction count every task of every pair, so a table of arms against one
    baseline is corrected as a whole. paired / confidence: of those tests; significance: the
    rest of their settings (ASO threshold, the difference the seeds-needed line is for, ...),
    defaults if None. A comparison of selections is made at each level of the other settings
    the runs' rows differ in (a factorial design: static vs dynamic masking at objective=mlm
    and at objective=mlm_nsp); pool: across those levels, in one test, instead.

    Pretraining runs (metrics.json without a main_metric) have a table of their own
    ("pretraining") and are compared on their held-out scores; their downstream finetunes are
    finetuning runs, rows named by the pretraining's settings.

    source: where runs are read from (collect.SOURCES). references_file: the published
    scores (default: the packaged bertkit/reporting/published_scores.yaml); reference_keys:
    the entries to show (None: those whose models match a system's model; ["none"]: none).
    """
    root = Path(root)
    if decimals < 0:
        raise BertkitError(f"--decimals {decimals}: must be 0 or more")
    runs, pretraining, failed = collect(root, source=source)
    # Runs that successive halving stopped part-way hold partial scores: they are counted and
    # listed, never chosen as a task's best configuration.
    stopped = [r for r in [*runs, *pretraining] if not r.complete]
    runs = [r for r in runs if r.complete]
    pretraining = [r for r in pretraining if r.complete]
    if not runs and not pretraining:
        raise BertkitError(_no_runs_message(root, source, stopped, failed))
    tasks = sorted({r.task for r in runs})
    task_info = _task_info(runs, tasks)
    split = RowSplit.of(runs)
    system_rows = _system_rows(runs, tasks, root, split)
    references = _references(system_rows, task_info, references_file, reference_keys)
    rows = _table_rows(system_rows, task_info, references)
    metrics = {t: info["metric"] for t, info in task_info.items()}
    pretraining_split = RowSplit.of(pretraining)
    arms = pretraining_rows(pretraining, pretraining_split, lambda p: relative_dir(p, root))
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
                                              scale=1.0) if runs else "",
        "table_csv": glue_table_csv(rows, tasks, scale=1.0) if runs else "",
        "pretraining": {"n_runs": len(pretraining),
                        "rows_split_by": _split_facts(pretraining_split, pretraining),
                        "systems": arms,
                        "table_markdown": pretraining_table(arms, decimals) if arms else "",
                        "table_csv": pretraining_csv(arms) if arms else ""},
        "failed": [{"run_dir": relative_dir(f.run_dir, root), "error": f.error}
                   for f in failed],
        "comparisons": [],
        "stopped": [relative_dir(r.run_dir, root) for r in stopped],
        "halving": collect_halving(root),
    }
    if compare:
        settings = dataclasses.replace(significance or Significance(), paired=paired,
                                       confidence=confidence, pool=pool)
        populations = [p for p in (Population(runs, split, task_info),
                                   Population(pretraining, pretraining_split, None)) if p.runs]
        report["comparisons"] = _compare_all(populations, root, compare, settings)
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
    message = (f"{root}: no finetuning or pretraining runs found "
               f"({NOT_FOUND.get(source, source)})")
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
                            "settings": split.differing(first),
                            # the splits it cut to their first examples ({}: none)
                            "partial": first.limited_samples, "tasks": per_task})
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
                if system["partial"]:  # a score on the first examples is not the task's
                    skipped.append({"reference": reference.key, "task": task,
                                    "reason": f"`{system['system']}` is scored on part of "
                                              f"its data"})
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


@dataclass(frozen=True)
class Population:
    """Runs compared among themselves: the finetunes (per task, on its main metric; task_info)
    or the pretraining runs (task_info None: on their held-out scores)."""

    runs: list
    split: RowSplit
    task_info: dict | None


def _compare_all(populations: Sequence[Population], root: Path,
                 pairs: Sequence[Sequence[str]], settings: Significance) -> list[dict]:
    """Per pair, B against A, one test per task (or pretraining metric) and level: Welch's
    t-test (paired: the paired t-test over the seeds both groups ran), ASO's ε_min, a
    bootstrap CI of the difference, Holm-adjusted p-values over every test of the report, and
    the seeds per arm needed to detect settings.detect points.

    Sides given as settings (KEY=VALUE) are compared at each level of the other settings the
    rows differ in (identity.RowSplit.other_factors: static vs dynamic at objective=mlm, at
    objective=mlm_nsp), unless settings.pool; a run on part of its data (identity.marks) is a
    level of its own, never pooled with full runs. A finetuning group's values are the seeds
    of its best configuration on dev for the task (its row's settings and grid point, as the
    table's rows): a glob over a whole grid compares the configurations one would report,
    and one over several rows never pools them (with pool: its rows pooled at the best grid
    point).
    """
    gathered = [_tests(populations, root, a, b, settings) for a, b in pairs]
    holm = holm_adjust({(i, key): test["stats"]["p_value"]
                        for i, found in enumerate(gathered)
                        for key, test in found["tests"].items()})  # one family: every row
    alpha = 1 - settings.confidence
    comparisons = []
    for i, ((text_a, text_b), found) in enumerate(zip(pairs, gathered, strict=True)):
        sides = found["sides"]
        results = {}
        for key, test in found["tests"].items():
            beyond, notes = _beyond_t(test["values_a"], test["values_b"], test["point"],
                                      test["higher_is_better"], settings, len(holm))
            entry = {k: test[k] for k in ("task", "metric", "what", "level",
                                          "higher_is_better", "a", "b", "scale")}
            entry.update({**test["stats"], "p_holm": holm[(i, key)], **beyond,
                          "notes": list(dict.fromkeys(test["notes"] + notes))})
            entry["verdict"] = _verdict(entry, sides["a"].label, sides["b"].label, alpha)
            results[key] = entry
        comparisons.append({"glob_a": text_a, "glob_b": text_b,
                            # The sides as the table names them; their settings when they
                            # are KEY=VALUE selections (None: a glob), full keys.
                            "label_a": sides["a"].label, "label_b": sides["b"].label,
                            "describe_a": sides["a"].describe(),
                            "describe_b": sides["b"].describe(),
                            "selection_a": sides["a"].settings,
                            "selection_b": sides["b"].settings,
                            **dataclasses.asdict(settings), "n_runs_a": found["n_runs"]["a"],
                            "n_runs_b": found["n_runs"]["b"], "tasks": results,
                            "skipped": found["skipped"]})
    return comparisons


def _tests(populations: Sequence[Population], root: Path, text_a: str, text_b: str,
           settings: Significance) -> dict:
    """One pair's sides (selection.Side), its tests by row label (each with the groups'
    values and compare_groups' result) and the rows it could not test, with why in one
    sentence. A side is resolved in each population (finetunes, pretraining runs) on its
    own; one that selects nothing in either is the error of the first."""
    resolved, errors = [], []
    for population in populations:
        try:
            resolved.append((population, [resolve_side(text, population.runs, root,
                                                       relative_dir)
                                          for text in (text_a, text_b)]))
        except BertkitError as err:
            errors.append(err)
    if not resolved:
        raise errors[0]
    if all({r.run_dir for r in a} == {r.run_dir for r in b}
           for _, ((_, a), (_, b)) in resolved):
        runs = sum(len(a) for _, ((_, a), _) in resolved)
        raise BertkitError(f"--compare: {text_a!r} and {text_b!r} select the same {runs} "
                           f"run(s); compare two selections that differ")
    found = {"sides": {"a": resolved[0][1][0][0], "b": resolved[0][1][1][0]},
             "n_runs": {"a": sum(len(s[0][1]) for _, s in resolved),
                        "b": sum(len(s[1][1]) for _, s in resolved)},
             "tests": {}, "skipped": {}}
    for population, ((side_a, runs_a), (side_b, runs_b)) in resolved:
        _population_tests(population, root, side_a, runs_a, side_b, runs_b, settings, found)
    return found


def _population_tests(population: Population, root: Path, side_a: Side, runs_a: list,
                      side_b: Side, runs_b: list, settings: Significance,
                      found: dict) -> None:
    split = population.split
    factorial = (side_a.settings is not None and side_b.settings is not None
                 and not settings.pool)
    compared = [*(side_a.settings or {}), *(side_b.settings or {})]
    others = split.other_factors([*runs_a, *runs_b], compared) if factorial else ()
    finetunes = population.task_info is not None
    tasks = (sorted({r.task for r in runs_a} & {r.task for r in runs_b}) if finetunes
             else [PRETRAINING_TASK])
    for task in tasks:
        levels: dict[tuple, dict] = {}
        for side, runs in (("a", runs_a), ("b", runs_b)):
            for run in (r for r in runs if r.task == task):
                level = levels.setdefault(split.level(run, others), {
                    "name": split.level_name(run, others), "a": [], "b": []})
                level[side].append(run)
        for level in (levels[k] for k in sorted(levels)):
            for metric in _metrics(population, task, level):
                _one_test(population, root, task, metric, level, settings, found)


def _metrics(population: Population, task: str, level: dict) -> list[tuple]:
    """(metric, what the tables call it, higher is better, scale) of one task's test(s): a
    finetune's main metric; every held-out score a pretraining arm of each side has."""
    if population.task_info is not None:
        info = population.task_info[task]
        return [(info["metric"], info["header"], True, info["scale"])]
    had = [{m for r in level[side] for m in r.scores} for side in ("a", "b")]
    return [(m, METRIC_LABELS[m], HIGHER_IS_BETTER[m], metric_scale(m))
            for m in METRIC_LABELS if m in had[0] | had[1]]


def _one_test(population: Population, root: Path, task: str, metric: tuple, level: dict,
              settings: Significance, found: dict) -> None:
    name, what, higher, scale = metric
    finetunes = population.task_info is not None
    label = (task if finetunes else f"{PRETRAINING_TASK} {what}") + at_level(level["name"])
    # A row that is not tested is named as a tested one is (sections.row_title).
    shown = (population.task_info[task]["header"] if finetunes
             else f"{what} ({'higher' if higher else 'lower'} is better)") + at_level(level["name"])
    missing = [side.upper() for side in ("a", "b") if not level[side]]
    if missing:
        found["skipped"][shown] = (f"no run of {' or '.join(missing)} here; the other side "
                                   f"has {len(level['a'] or level['b'])}")
        return
    if finetunes:
        groups = {side: _configuration(level[side], root, population.split, settings.pool)
                  for side in ("a", "b")}
    else:
        groups = {side: _pretraining_group(level[side], root, population.split, name,
                                           settings.pool) for side in ("a", "b")}
        spans = [f"{side.upper()} spans {groups[side]['rows_in_group']} arms"
                 for side in ("a", "b") if groups[side]["rows_in_group"] > 1]
        if spans:
            found["skipped"][shown] = (f"{' and '.join(spans)}; select one arm by its "
                                       f"settings, or pool them with --pool")
            return
    values = {side: groups[side]["values"] for side in ("a", "b")}
    counts = [len(values["a"]), len(values["b"])]
    if not finetunes and not all(counts):  # NSP of objective=mlm_nsp, none of objective=mlm
        side = "a" if counts[0] else "b"
        found["skipped"][shown] = (f"only {side.upper()} ({found['sides'][side].label}) "
                                   f"reports {what}")
        return
    if min(counts) < 2:
        found["skipped"][shown] = _too_few(*counts, "seed" if not settings.pool else "run")
        return
    if settings.paired:  # by seed: the same seed of A and of B form a pair
        values = {side: dict(zip(groups[side]["seeds"], values[side], strict=True))
                  for side in ("a", "b")}
        if set(values["a"]) != set(values["b"]):
            found["skipped"][shown] = (
                f"the paired test needs the same seeds on both sides: A ran "
                f"{_seeds(values['a'])}, B ran {_seeds(values['b'])}")
            return
    stats_, notes = _quietly(compare_groups, values["a"], values["b"],
                             confidence=settings.confidence, paired=settings.paired)
    found["tests"][label] = {"task": task, "metric": name, "what": what,
                             "level": level["name"], "higher_is_better": higher,
                             "scale": scale, "a": groups["a"], "b": groups["b"],
                             "values_a": values["a"], "values_b": values["b"],
                             "point": 1 / scale if finetunes else 1 / PERCENT,
                             "stats": stats_, "notes": notes}


def _too_few(n_a: int, n_b: int, unit: str) -> str:
    """One sentence: how many seeds each side has, how many the test needs."""
    have = (f"{n_a} {unit}{'s' if n_a != 1 else ''} of each side" if n_a == n_b else
            f"{n_a} {unit}{'s' if n_a != 1 else ''} of A and {n_b} of B")
    return f"{have}; the test needs at least {MIN_SEEDS} per side"


MIN_SEEDS = 2  # per side, for a t-test (statistics.compare_groups)


def _seeds(values: dict) -> str:
    return ", ".join(map(str, sorted(values))) or "none"


def _configuration(runs: Sequence[RunResult], root: Path, split: RowSplit,
                   pool: bool = False) -> dict:
    """_best over a --compare group: its best configuration, named as its table row, and how
    many rows the group spans (more than one: the others were not pooled in). pool: the
    group's rows pooled, at their best grid point."""
    best = _best(runs, root, None if pool else split)
    rows = len({split.key(r) for r in runs})
    if pool:
        return {**best, "system": f"{rows} row(s) pooled", "rows_in_group": 1}
    chosen = next(r for r in runs if relative_dir(r.run_dir, root) == best["run_dirs"][0])
    return {**best, "system": split.name(chosen), "rows_in_group": rows}


def _pretraining_group(runs: Sequence[PretrainingRun], root: Path, split: RowSplit,
                       metric: str, pool: bool) -> dict:
    """A --compare group of pretraining runs for one metric: every seed of its arm (pool:
    of its arms) that has the score."""
    chosen = sorted((r for r in runs if metric in r.scores),
                    key=lambda r: (r.seed, str(r.run_dir)))
    rows = len({split.key(r) for r in runs})
    return {"system": f"{rows} arm(s) pooled" if pool else split.name(runs[0]),
            "rows_in_group": 1 if pool else rows,
            "seeds": [r.seed for r in chosen], "values": [r.scores[metric] for r in chosen],
            "run_dirs": [relative_dir(r.run_dir, root) for r in chosen]}


# What a warning of scipy or deepsig means for a row, in words.
NEARLY_IDENTICAL = ("the seeds of a side score (nearly) alike, so the t-test's spread is "
                    "near zero and its p is not to be trusted")
LIBRARY_WARNED = "the statistics library warned on this row; read its numbers with care"


def _quietly(function, *args, **kwargs):
    """function's result and its warnings as sentences (none printed raw)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = function(*args, **kwargs)
    return result, [_plain(w) for w in caught]


def _plain(warning: warnings.WarningMessage) -> str:
    text = str(warning.message)
    if "Precision loss" in text or "catastrophic cancellation" in text:
        return NEARLY_IDENTICAL
    return LIBRARY_WARNED


def _beyond_t(values_a, values_b, point: float, higher_is_better: bool,
              settings: Significance, comparisons: int) -> tuple[dict, list[str]]:
    """ASO, the bootstrap interval and the seeds-needed line of one comparison, and the
    libraries' warnings as sentences. Tied groups (the same scores) are no difference, said
    so: ASO is not asked (its ε_min would read 1 both ways, and deepsig warns of a division
    by zero). ASO asks whether B is better: for a score where lower is better (a loss) it is
    asked of the negated scores. point: one displayed point (--detect's unit) in the
    scores' units."""
    same = tied(values_a, values_b)
    if settings.paired:  # compare_groups checked that the seeds match
        keys = sorted(values_a)
        values_a, values_b = [values_a[k] for k in keys], [values_b[k] for k in keys]
    values_a, values_b = list(values_a), list(values_b)
    sign = 1.0 if higher_is_better else -1.0
    notes: list[str] = []
    # Both directions: ε_min near 1 only says B is not better; whether A is better (a method
    # that hurts) is the test with the roles swapped.
    epsilons = [None, None]
    if not same:
        for i, (x, y) in enumerate(((values_a, values_b), (values_b, values_a))):
            epsilons[i], caught = _quietly(
                aso_epsilon, [sign * v for v in x], [sign * v for v in y],
                confidence=settings.confidence, num_comparisons=comparisons,
                seed=settings.seed, bootstrap_iterations=settings.aso_iterations)
            notes += caught
    (low, high), caught = _quietly(bootstrap_difference_ci, values_a, values_b,
                                   settings.confidence, paired=settings.paired,
                                   resamples=settings.resamples, seed=settings.seed)
    notes += caught
    differences = np.subtract(values_b, values_a) if settings.paired else None
    needed = seeds_needed(
        float(np.std(values_a, ddof=1)), float(np.std(values_b, ddof=1)),
        settings.detect * point, alpha=1 - settings.confidence,
        power=settings.power,
        paired_std=float(np.std(differences, ddof=1)) if differences is not None else None)
    epsilon, epsilon_a = epsilons
    return {"tied": same, "aso_epsilon": epsilon, "aso_comparisons": comparisons,
            "b_better_by_aso": not same and epsilon < settings.aso_threshold,
            "aso_epsilon_a_over_b": epsilon_a,
            "a_better_by_aso": not same and epsilon_a < settings.aso_threshold,
            "bootstrap_low": low, "bootstrap_high": high, "seeds_needed": needed}, notes


# --detect D is in points: of a fraction shown ×100, D/100; of a score in percent (SQuAD),
# D; of a pretraining loss in nats, D/100 (a point of a percent scale).
PERCENT = 100.0


def _verdict(entry: dict, label_a: str, label_b: str, alpha: float) -> str:
    """A plain sentence: which side is better, in the metric's direction (lower for a loss):
    Holm's p below 1 − confidence and ASO calling it better (docs/reports.md, "How to call a
    result"), or that neither is shown to be."""
    what = entry["what"]
    if entry["tied"]:
        return "tied: both sides have the same scores, no difference"
    word = "higher" if entry["higher_is_better"] else "lower"
    better = label_b if (entry["difference"] > 0) == entry["higher_is_better"] else label_a
    p = entry["p_holm"]
    if p is None or not math.isfinite(p):
        return (f"each side's seeds score alike, so the t-test cannot tell; {better} has the "
                f"{word} {what}")
    by_aso = entry["b_better_by_aso"] if better == label_b else entry["a_better_by_aso"]
    if p < alpha and by_aso:
        return f"{better} is better ({word} {what}): Holm p and ASO agree"
    if p < alpha:
        return (f"{better} has the {word} {what} (Holm p {p:.2g}), but ASO does not call it "
                f"better: not conclusive")
    return (f"no significant difference (Holm p {p:.2g} ≥ {alpha:g}); {better} has the "
            f"{word} {what} in these seeds")

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
    written = [write_text_atomic(out_dir / "report.md", render_markdown(report))]
    if report["systems"]:
        written.append(write_text_atomic(out_dir / "results.csv", report["table_csv"]))
    if report["pretraining"]["systems"]:
        written.append(write_text_atomic(out_dir / PRETRAINING_CSV,
                                         report["pretraining"]["table_csv"]))
    written.append(write_json_atomic(out_dir / "report.json", _json_safe(report)))
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
