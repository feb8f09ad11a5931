"""Assemble bertkit-report from the runs on disk and the pure functions of report_*.

build_report reads the runs (run_results) and computes every number (report_statistics,
report_tables); write_report writes report.md, results.csv, report.json and the figures.

A "system" is one recipe + model; each row of the table is one. For each system and task the
grid point (learning_rate, train_batch_size, num_train_epochs) is the one with the best mean
main_value over seeds on dev (best_grid_point), and the cell summarizes the seeds there.
Scores of a task whose main values are all within [-1, 1] (fractions, as GLUE writes them)
are shown ×100; others (SQuAD, already in percent) as they are. report.json keeps the raw
values next to the scale.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from fnmatch import fnmatch
from pathlib import Path

from bertkit.errors import BertkitError
from bertkit.report_plots import plot_expected_max, plot_seeds
from bertkit.report_statistics import best_grid_point, compare_groups, expected_max_curve
from bertkit.report_tables import column_header, glue_table_csv, glue_table_markdown
from bertkit.run_outputs import write_json_atomic, write_text_atomic
from bertkit.run_results import GRID_KEYS, RunResult, collect_runs


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


def build_report(
    root: str | Path, compare: Sequence[str] | None = None, decimals: int = 1
) -> dict:
    """Everything the report shows, as plain data (the content of report.json)."""
    root = Path(root)
    if decimals < 0:
        raise BertkitError(f"--decimals {decimals}: must be 0 or more")
    runs, failed = collect_runs(root)
    if not runs:
        message = f"{root}: no finetuning runs found (no metrics.json with a main_metric)"
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
    metrics = {t: info["metric"] for t, info in task_info.items()}
    report = {
        "outputs_dir": str(root),
        "decimals": decimals,
        "n_runs": len(runs),
        "tasks": task_info,
        "systems": system_rows,
        "table_markdown": glue_table_markdown(rows, tasks, metrics, decimals=decimals,
                                              scale=1.0),
        "table_csv": glue_table_csv(rows, tasks, scale=1.0),
        "failed": [{"run_dir": relative_dir(f.run_dir, root), "error": f.error}
                   for f in failed],
        "comparison": None,
    }
    if compare:
        report["comparison"] = _compare(runs, root, compare[0], compare[1], task_info)
    return report


def _compare(runs, root: Path, glob_a: str, glob_b: str, task_info: dict) -> dict:
    """Welch's t-test per task between the runs under glob_a (A) and glob_b (B).

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
            stats = compare_groups(best_a["values"], best_b["values"])
        except BertkitError as err:
            skipped[task] = str(err)
            continue
        results[task] = {"a": best_a, "b": best_b, "scale": task_info[task]["scale"], **stats}
    return {"glob_a": glob_a, "glob_b": glob_b, "n_runs_a": len(groups["a"]),
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
    out = ["# bertkit report", "",
           f"{report['n_runs']} finished run(s) and {len(report['failed'])} failed job(s) "
           f"under `{report['outputs_dir']}`.", "",
           "## Results", "",
           "Main metric on dev: mean ± std (median) over seeds at the grid point with the best "
           "mean on dev; fractions are shown ×100. Average: mean of the task means, only for "
           "rows with every task.", "",
           report["table_markdown"].rstrip("\n"), "",
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
                                        f"{round(100 * 0.95)}% CI", "p", "test"],
                                       body).rstrip("\n"))
        else:
            out.append("No task has runs in both groups.")
        for task, reason in comparison["skipped"].items():
            out.append(f"\n- {task}: not compared: {reason}")
    out += ["", "## Figures", ""]
    for task in tasks:
        out.append(f"- {tasks[task]['header']}: [expected best vs trials]"
                   f"(expected_max_{safe_name(task)}.png), "
                   f"[seeds at the best grid point](seeds_{safe_name(task)}.png)")
    return "\n".join(out) + "\n"


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
