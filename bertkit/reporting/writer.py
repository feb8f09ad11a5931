"""Assemble bertkit-report from the runs on disk and the pure functions of report_*.

build_report reads the runs (run_results) and computes every number (report_statistics,
report_tables); write_report writes report.md, results.csv, report.json and the figures.

A "system" is one recipe + model; each row of the table is one. For each system and task the
grid point (learning_rate, train_batch_size, num_train_epochs) is the one with the best mean
main_value over seeds on dev (best_grid_point), and the cell summarizes the seeds there.
Scores of a task whose main values are all within [-1, 1] (fractions, as GLUE writes them)
are shown ×100; others (SQuAD, already in percent) as they are. report.json keeps the raw
values next to the scale.

Published scores (recipes/references/published_scores.yaml, see reference_scores) are added
as rows of the table and each system's mean is measured against them ("Distance to
reference"), with the reference's split said: the GLUE numbers of the papers are test-server
scores, bertkit's are dev scores. Runs that successive halving stopped part-way are listed,
never ranked; each sweep's halving.json becomes a section of its own (report_halving).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from fnmatch import fnmatch
from pathlib import Path

from bertkit.data.atomic_files import write_json_atomic, write_text_atomic
from bertkit.errors import BertkitError
from bertkit.reporting.halving import collect_halving, render_halving
from bertkit.reporting.plots import plot_expected_max, plot_seeds
from bertkit.reporting.references import (
    choose_references,
    default_references_path,
    load_references,
    matches_model,
)
from bertkit.reporting.results import GRID_KEYS, METRICS_FILE, RunResult, collect_runs
from bertkit.reporting.statistics import best_grid_point, compare_groups, expected_max_curve
from bertkit.reporting.tables import column_header, glue_table_csv, glue_table_markdown


def system_name(run: RunResult) -> str:
    parts = [p for p in (run.recipe, run.model) if p]
    return " / ".join(parts) or "(unnamed)"


def relative_dir(path: Path, root: Path) -> str:
    try:
        return Path(path).relative_to(root).as_posix()
    except ValueError:
        return Path(path).as_posix()


def safe_name(task: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", task)


def _task_scale(runs: Sequence[RunResult]) -> float:
    return 100.0 if all(abs(r.main_value) <= 1.0 for r in runs) else 1.0


def _best(runs: Sequence[RunResult], root: Path) -> dict:
    """The best grid point of one task's runs and the seeds there (raw values)."""
    point, summary = best_grid_point(runs)
    chosen = sorted((r for r in runs if r.grid_point == point),
                    key=lambda r: (r.seed, str(r.run_dir)))
    return {
        "grid_point": dict(zip(GRID_KEYS, point, strict=True)),
        "grid_points_tried": len({r.grid_point for r in runs}),
        "runs_tried": len(runs),
        "summary": summary,
        "seeds": [r.seed for r in chosen],
        "values": [r.main_value for r in chosen],
        "run_dirs": [relative_dir(r.run_dir, root) for r in chosen],
    }


NOT_FOUND = {
    "files": "no metrics.json with a main_metric",
    "wandb": "no finished W&B run log",
    "auto": "no metrics.json with a main_metric, no finished W&B run log",
}


def build_report(
    root: str | Path,
    compare: Sequence[str] | None = None,
    decimals: int = 1,
    source: str = "auto",
    references_file: str | Path | None = None,
    reference_keys: Sequence[str] | None = None,
    paired: bool = False,
    confidence: float = 0.95,
) -> dict:
    """Everything the report shows, as plain data (the content of report.json).

    source: where runs are read from (run_results.SOURCES). references_file: the published
    scores (default: the packaged recipes/references/published_scores.yaml); reference_keys:
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
        message = f"{root}: no finetuning runs found ({NOT_FOUND.get(source, source)})"
        if stopped:
            message += f"; {len(stopped)} run(s) stopped part-way by successive halving"
        if failed:
            first = failed[0]
            message += (f"; {len(failed)} failed job(s), the first "
                        f"{relative_dir(first.run_dir, root)}: {_one_line(first.error)}")
        raise BertkitError(message)

    tasks = sorted({r.task for r in runs})
    task_info = {}
    for task in tasks:
        of_task = [r for r in runs if r.task == task]
        metric = "/".join(sorted({r.main_metric for r in of_task}))
        task_info[task] = {"metric": metric, "scale": _task_scale(of_task),
                           "header": column_header(task, metric)}

    systems: dict[str, list[RunResult]] = {}
    for run in runs:
        systems.setdefault(system_name(run), []).append(run)
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
        system_rows.append({"system": name, "recipe": systems[name][0].recipe,
                            "model": systems[name][0].model, "tasks": per_task})

    rows = {s["system"]: {t: [v * task_info[t]["scale"] for v in b["values"]]
                          for t, b in s["tasks"].items()} for s in system_rows}
    references = _references(system_rows, task_info, references_file, reference_keys)
    for reference in references["chosen"]:
        if reference["tasks_shown"]:
            rows[reference["row"]] = {t: [reference["scores"][t]]
                                      for t in reference["tasks_shown"]}
    metrics = {t: info["metric"] for t, info in task_info.items()}
    report = {
        "outputs_dir": str(root),
        "decimals": decimals,
        "n_runs": len(runs),
        "source": source,
        "runs_by_source": {name: sum(r.source == name for r in runs)
                           for name in sorted({r.source for r in runs})},
        "tasks": task_info,
        "systems": system_rows,
        "references": references,
        "table_markdown": glue_table_markdown(rows, tasks, metrics, decimals=decimals,
                                              scale=1.0),
        "table_csv": glue_table_csv(rows, tasks, scale=1.0),
        "failed": [{"run_dir": relative_dir(f.run_dir, root), "error": f.error}
                   for f in failed],
        "comparison": None,
        "stopped": [relative_dir(r.run_dir, root) for r in stopped],
        "halving": collect_halving(root),
    }
    if compare:
        report["comparison"] = _compare(runs, root, compare[0], compare[1], task_info,
                                        paired=paired, confidence=confidence)
    return report


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


def _compare(runs, root: Path, glob_a: str, glob_b: str, task_info: dict,
             paired: bool = False, confidence: float = 0.95) -> dict:
    """Welch's t-test (paired: the paired t-test over the seeds both groups ran) per task
    between the runs under glob_a (A) and glob_b (B).

    Each group's values are the seeds at that group's best dev grid point for the task, so a
    glob that covers a whole grid compares the configurations one would report.
    """
    groups = {}
    for label, pattern in (("a", glob_a), ("b", glob_b)):
        chosen = [r for r in runs if fnmatch(relative_dir(r.run_dir, root), pattern)]
        if not chosen:
            raise BertkitError(f"--compare: {pattern!r} matches no run directory under {root}")
        groups[label] = chosen
    results, skipped = {}, {}
    for task in sorted({r.task for r in groups["a"]} & {r.task for r in groups["b"]}):
        best_a = _best([r for r in groups["a"] if r.task == task], root)
        best_b = _best([r for r in groups["b"] if r.task == task], root)
        try:
            values_a, values_b = best_a["values"], best_b["values"]
            if paired:  # by seed: the same seed of A and of B form a pair
                values_a = dict(zip(best_a["seeds"], values_a, strict=True))
                values_b = dict(zip(best_b["seeds"], values_b, strict=True))
            stats = compare_groups(values_a, values_b, confidence=confidence, paired=paired)
        except BertkitError as err:
            skipped[task] = str(err)
            continue
        results[task] = {"a": best_a, "b": best_b, "scale": task_info[task]["scale"], **stats}
    return {"glob_a": glob_a, "glob_b": glob_b, "paired": paired, "confidence": confidence,
            "n_runs_a": len(groups["a"]),
            "n_runs_b": len(groups["b"]), "tasks": results, "skipped": skipped}


def _fmt(value: float, decimals: int) -> str:
    return "nan" if value is None or math.isnan(value) else f"{value:.{decimals}f}"


def _markdown_table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(lines) + "\n"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def render_markdown(report: dict) -> str:
    d = report["decimals"]
    tasks = report["tasks"]
    read_from = ", ".join(f"{n} from {'metrics.json' if name == METRICS_FILE else 'W&B run logs'}"
                          for name, n in report["runs_by_source"].items())
    out = ["# bertkit report", "",
           f"{report['n_runs']} finished run(s) and {len(report['failed'])} failed job(s) "
           f"under `{report['outputs_dir']}`; runs read {read_from} (--source "
           f"{report['source']}).", "",
           "## Results", "",
           "Main metric on dev: mean ± std (median) over seeds at the grid point with the best "
           "mean on dev; fractions are shown ×100. Average: mean of the task means, only for "
           "rows with every task." + _reference_rows_note(report["references"]), "",
           report["table_markdown"].rstrip("\n"), "",
           *_render_distances(report["references"], tasks, d),
           "## Best grid point per task", ""]
    body = []
    for system in report["systems"]:
        for task, best in system["tasks"].items():
            scale, s, g = tasks[task]["scale"], best["summary"], best["grid_point"]
            spread = ("" if s["n"] < 2 else f" ± {_fmt(s['std'] * scale, d)}")
            body.append([system["system"], tasks[task]["header"], f"{g['learning_rate']:g}",
                         str(g["train_batch_size"]), f"{g['num_train_epochs']:g}", str(s["n"]),
                         _fmt(s["mean"] * scale, d) + spread, _fmt(s["median"] * scale, d),
                         f"{best['grid_points_tried']} ({best['runs_tried']} runs)"])
    out.append(_markdown_table(["System", "Task", "learning_rate", "batch size", "epochs",
                                "seeds", "mean ± std", "median", "grid points tried"],
                               body).rstrip("\n"))
    out += ["", "## Failed jobs", ""]
    if report["failed"]:
        out += [f"- `{f['run_dir']}`: {_one_line(f['error'])}" for f in report["failed"]]
    else:
        out.append("None.")
    comparison = report["comparison"]
    if comparison is not None:
        out += ["", "## Significance", "",
                f"A: runs matching `{comparison['glob_a']}` ({comparison['n_runs_a']} runs); "
                f"B: runs matching `{comparison['glob_b']}` ({comparison['n_runs_b']} runs). "
                "Per task, each group's seeds at its best dev grid point; difference = "
                "mean(B) − mean(A), two-sided p-value.", ""]
        body = []
        for task, c in comparison["tasks"].items():
            scale = c["scale"]
            body.append([tasks[task]["header"], str(c["n_a"]), str(c["n_b"]),
                         _fmt(c["mean_a"] * scale, d), _fmt(c["mean_b"] * scale, d),
                         _fmt(c["difference"] * scale, d),
                         f"[{_fmt(c['ci_low'] * scale, d)}, {_fmt(c['ci_high'] * scale, d)}]",
                         "nan" if math.isnan(c["p_value"]) else f"{c['p_value']:.4g}",
                         c["test"]])
        if body:
            out.append(_markdown_table(["Task", "n A", "n B", "mean A", "mean B", "B − A",
                                        f"{100 * comparison['confidence']:g}% CI", "p", "test"],
                                       body).rstrip("\n"))
        else:
            out.append("No task has runs in both groups.")
        for task, reason in comparison["skipped"].items():
            out.append(f"\n- {task}: not compared: {reason}")
    out += render_halving(report["halving"])
    if report["stopped"]:
        out += ["", f"{len(report['stopped'])} run(s) stopped part-way by successive halving "
                    "are not in the tables."]
    out += ["", "## Figures", ""]
    for task in tasks:
        out.append(f"- {tasks[task]['header']}: [expected best vs trials]"
                   f"(expected_max_{safe_name(task)}.png), "
                   f"[seeds at the best grid point](seeds_{safe_name(task)}.png)")
    return "\n".join(out) + "\n"


def _reference_rows_note(references: dict) -> str:
    if not any(r["tasks_shown"] for r in references["chosen"]):
        return ""
    return (" Reference rows are published scores (one number each), labelled with their "
            "split: a test score is on other examples than bertkit's dev scores.")


def _render_distances(references: dict, tasks: dict, d: int) -> list[str]:
    """The "Distance to reference" section, ending with a blank line."""
    out = ["## Distance to reference", ""]
    if not references["chosen"]:
        out.append("No reference (`--reference none`)." if references["requested"] == ["none"]
                   else f"No reference in `{references['file']}` lists a model of these runs; "
                        "`--reference KEY` names one.")
        return out + [""]
    out += ["Per system and task: the system's mean on dev (at its best grid point, as in "
            "Results) minus the published score, in points. Where the reference is a test-set "
            "score, the difference also holds the gap between the dev and the test set.", ""]
    body = []
    for item in references["distances"]:
        note = ("reference on test, run on dev" if item["reference_split"] == "test"
                else "both on dev")
        if item["reference_note"]:
            note += f"; reference: {item['reference_note']}"
        body.append([item["system"], item["reference_label"], tasks[item["task"]]["header"],
                     f"{_fmt(item['system_mean'], d)} ({item['n_seeds']} seeds)",
                     _fmt(item["reference_value"], d), f"{item['difference']:+.{d}f}", note])
    if body:
        out.append(_markdown_table(["System", "Reference", "Task", "System (dev)", "Reference",
                                    "System − reference", "Note"], body).rstrip("\n"))
    else:
        out.append("No task of these runs has a reference score.")
    for item in references["skipped"]:
        out.append(f"\n- {item['reference']}, {item['task']}: not compared: {item['reason']}")
    shown = [r for r in references["chosen"] if r["tasks_shown"]]
    if shown:
        out += ["", "References:", ""]
        out += [f"- {r['label']} (`{r['key']}`, {r['split']} set): {r['source']}"
                for r in shown]
    if references["requested"] is not None:  # named ones without a task here are said so
        out += [f"\n- `{r['key']}`: no score for the tasks of these runs"
                for r in references["chosen"] if not r["tasks_shown"]]
    return out + [""]


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
    """Write every file of the report into out_dir; returns their paths."""
    out_dir = Path(out_dir)
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
