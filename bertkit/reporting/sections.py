"""report.md from the data of build_report (writer.py): one function per section, so each
section's wording can be read, and tested, on its own. Numbers are formatted here only:
report.json keeps them raw."""

from __future__ import annotations

import math
import re

from bertkit.data.metrics_file import METRICS_FILE
from bertkit.reporting.halving_section import render_halving
from bertkit.reporting.pretraining_section import LOSS_DECIMALS, render_pretraining
from bertkit.reporting.tables import markdown_cell as cell
from bertkit.reporting.tables import one_line


def fmt(value: float, decimals: int) -> str:
    return "nan" if value is None or math.isnan(value) else f"{value:.{decimals}f}"


def markdown_table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(map(cell, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(cell, cells)) + " |" for cells in body]
    return "\n".join(lines) + "\n"



def render_markdown(report: dict) -> str:
    tasks = report["tasks"]
    if report["systems"]:
        out = [*_results(report), *render_distances(report["references"], tasks,
                                                    report["decimals"]),
               *_best_grid_points(report), "", *render_pretraining(report)]
    else:
        out = [*_title(report), *render_pretraining(report)]
    out += _failed_jobs(report["failed"])
    if report["comparisons"]:
        out += _significance(report["comparisons"], tasks, report["decimals"])
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


def safe_name(task: str) -> str:
    """The task as it appears in the figures' file names."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", task)


def _title(report: dict) -> list[str]:
    """The title and where the runs were read from."""
    read_from = ", ".join(f"{n} from {'metrics.json' if name == METRICS_FILE else 'W&B run logs'}"
                          for name, n in report["runs_by_source"].items()) or "none"
    pretraining = report["pretraining"]["n_runs"]
    return ["# bertkit report", "",
            f"{report['n_runs']} finished run(s)"
            + (f", {pretraining} pretraining run(s)" if pretraining else "")
            + f" and {len(report['failed'])} failed job(s) under `{report['outputs_dir']}`; "
            f"runs read {read_from} (--source {report['source']}).", ""]


def _results(report: dict) -> list[str]:
    """The title, where the runs were read from, and the results table."""
    return [*_title(report),
            "## Results", "",
            "Main metric on dev: mean ± std (median) over seeds at the grid point with the best "
            "mean on dev; fractions are shown ×100. Average: mean of the task means, only for "
            "rows with every task." + _reference_rows_note(report["references"]), "",
            *_rows_split_by(report["rows_split_by"]),
            report["table_markdown"].rstrip("\n"), ""]


def _rows_split_by(split: dict) -> list[str]:
    """Which settings make the rows: a reader sees what was held equal and what was not."""
    sources = ", ".join(f"{n} from {source}" for source, n in split["settings_sources"].items())
    if not split["keys"]:
        out = [f"Every run of a task has the same settings, seeds aside (settings read: "
               f"{sources}): one row per model."]
    else:
        keys = ", ".join(f"`{k}`" for k in split["keys"])
        out = [f"Rows are split by every setting in which runs of a task differ, seeds, the "
               f"grid (learning rate, batch size, epochs) and result-neutral settings aside: "
               f"{keys} (settings read: {sources}). Runs pool as seeds only when all of these "
               f"are equal."]
        if split["common"]:
            common = ", ".join(f"`{k}`={cell(v)}" for k, v in split["common"].items())
            out[0] += (f" A row's name shows the settings in which it differs from the value "
                       f"most rows have; left out, those values are: {common}.")
    if split["unknown"]:
        unknown = ", ".join(f"`{k}`" for k in split["unknown"][:UNKNOWN_SHOWN])
        more = len(split["unknown"]) - UNKNOWN_SHOWN
        out[0] += (f" **Cannot tell** whether {split['runs_without_unknown']} run(s) differ "
                   f"in {unknown}{f' and {more} more' if more > 0 else ''}: they do not "
                   f"record it (a run without config.yaml records only metrics.json's "
                   f"hyperparameters; a run of an older bertkit, only the settings that "
                   f"existed then), so they are not pooled with runs that do; `?` stands "
                   f"for the missing value.")
    return [*out, ""]


UNKNOWN_SHOWN = 12  # settings named before "and N more"


def _best_grid_points(report: dict) -> list[str]:
    d, tasks = report["decimals"], report["tasks"]
    body = []
    for system in report["systems"]:
        for task, best in system["tasks"].items():
            scale, s, g = tasks[task]["scale"], best["summary"], best["grid_point"]
            spread = ("" if s["n"] < 2 else f" ± {fmt(s['std'] * scale, d)}")
            body.append([system["system"], tasks[task]["header"], f"{g['learning_rate']:g}",
                         str(g["train_batch_size"]), epochs_cell(g["num_train_epochs"],
                                                                 best.get("epochs_trained")),
                         str(s["n"]),
                         fmt(s["mean"] * scale, d) + spread, fmt(s["median"] * scale, d),
                         f"{best['grid_points_tried']} ({best['runs_tried']} runs)"])
    return ["## Best grid point per task", "",
            markdown_table(["System", "Task", "learning_rate", "batch size", "epochs",
                            "seeds", "mean ± std", "median", "grid points tried"],
                           body).rstrip("\n")]


def epochs_cell(planned: float, trained: list | None) -> str:
    """The epochs a grid point's seeds trained: the grid's num_train_epochs when they trained
    them all (or did not record it), else what they trained of it ("0.04 of 3": max_steps or
    a stop ended them first), a range where the seeds differ."""
    shown = sorted({f"{t:.{EPOCH_DIGITS}g}" for t in trained or () if t is not None},
                   key=float)
    if not shown or shown == [f"{planned:.{EPOCH_DIGITS}g}"]:
        return f"{planned:g}"
    return f"{shown[0]}{'–' + shown[-1] if len(shown) > 1 else ''} of {planned:g}"


EPOCH_DIGITS = 3  # significant digits of the epochs trained: 0.0435 -> 0.0435, 2.9999 -> 3


def _failed_jobs(failed: list[dict]) -> list[str]:
    out = ["", "## Failed jobs", ""]
    if failed:
        return out + [f"- `{f['run_dir']}`: {one_line(f['error'])}" for f in failed]
    return out + ["None."]


def _significance(comparisons: list[dict], tasks: dict, d: int) -> list[str]:
    """One table for every --compare: a row per pair, task (or pretraining score) and level,
    corrected as a whole; the rows that could not be tested, each in one sentence."""
    first = comparisons[0]  # the settings are the same for every pair
    confidence = f"{100 * first['confidence']:g}%"
    out = ["", "## Significance", ""]
    out += [f"- {_pair(c)}: A: {_describe(c, 'a')} ({c['n_runs_a']} runs); B: "
            f"{_describe(c, 'b')} ({c['n_runs_b']} runs)." for c in comparisons]
    out += ["", "Per task, each group's seeds at its best dev grid point (a pretraining score: "
            "every seed of the arm); where the sides are settings, at each level of the other "
            "settings the rows differ in (\"at objective=mlm\"), pooled across them only "
            "with --pool. Difference = mean(B) − mean(A), two-sided p-value; Holm p: adjusted "
            "over every row of the table. For a loss, lower is better: the verdict and ASO "
            "read it so. ε_min: the Almost Stochastic Order test (deepsig) that B is better "
            f"than A at {confidence} confidence, Bonferroni-corrected over the rows; B is "
            f"called better below {first['aso_threshold']:g} (0: B's scores dominate A's, 1: "
            f"A's dominate B's); ε_min, A over B: the same test with the roles swapped, A "
            f"called better below the same threshold. Bootstrap CI: percentile interval of the "
            f"difference ({first['resamples']} resamples). Seeds needed: per arm, for the "
            f"{'paired' if first['paired'] else 'Welch'} t-test to detect a difference "
            f"of {first['detect']:g} points (of a loss: hundredths) with power "
            f"{first['power']:g} at the measured spreads.", ""]
    body, notes, verdicts = [], [], []
    for comparison in comparisons:
        for label, c in comparison["tasks"].items():
            scale = c["scale"]
            for side in ("a", "b"):
                if c[side]["rows_in_group"] > 1:
                    notes.append(f"- {_pair(comparison)}, {label}: {side.upper()} matches runs "
                                 f"of {c[side]['rows_in_group']} rows; its best "
                                 f"configuration is `{c[side]['system']}`, the others are "
                                 f"not pooled in.")
            notes += [f"- {_pair(comparison)}, {label}: {note}." for note in c["notes"]]
            digits = _digits(c, d)
            body.append([_pair(comparison), row_title(c, tasks), str(c["n_a"]),
                         str(c["n_b"]), fmt(c["mean_a"] * scale, digits),
                         fmt(c["mean_b"] * scale, digits),
                         fmt(c["difference"] * scale, digits),
                         f"[{fmt(c['ci_low'] * scale, digits)}, "
                         f"{fmt(c['ci_high'] * scale, digits)}]",
                         _p(c["p_value"]), _p(c["p_holm"]), c["test"],
                         *_aso_cells(c),
                         f"[{fmt(c['bootstrap_low'] * scale, digits)}, "
                         f"{fmt(c['bootstrap_high'] * scale, digits)}]",
                         "> 10000" if c["seeds_needed"] is None else str(c["seeds_needed"])])
            verdicts.append(f"- {_pair(comparison)}, {row_title(c, tasks)}: {c['verdict']}.")
    skipped = [f"- {_pair(comparison)}, {label}: not compared: {reason}."
               for comparison in comparisons
               for label, reason in comparison["skipped"].items()]
    if body:
        out.append(markdown_table(["B vs A", "Task", "n A", "n B", "mean A", "mean B",
                                   "B − A", f"{confidence} CI (t)", "p", "Holm p", "test",
                                   "ε_min (ASO)", "ε_min, A over B",
                                   f"{confidence} CI (bootstrap)", "seeds needed"],
                                  body).rstrip("\n"))
        out += ["", "Verdicts:", "", *verdicts]
    elif not skipped:
        out.append("No task has runs in both groups.")
    notes += [f"- {_pair(comparison)}, {label}: tied: both groups have the same scores, so "
              f"there is no difference between them (ASO is not run)."
              for comparison in comparisons for label, c in comparison["tasks"].items()
              if c.get("tied")]
    if notes:
        out += ["", *notes]
    if skipped:
        out += ["", *skipped]
    return out


def row_title(c: dict, tasks: dict) -> str:
    """What a comparison row tests: "RTE (Acc) at objective=mlm", "MLM loss (lower is
    better)"."""
    if c["task"] in tasks:
        what = tasks[c["task"]]["header"]
    else:
        what = f"{c['what']} ({'higher' if c['higher_is_better'] else 'lower'} is better)"
    return what + at_level(c["level"])


def at_level(level: str) -> str:
    """" at objective=mlm" after what a row tests; a level that is only a mark (partial data)
    as its bracket; nothing for no level."""
    if not level:
        return ""
    return f" {level}" if level.startswith("(") else f" at {level}"


def _digits(c: dict, d: int) -> int:
    """Decimals of a row: a loss needs more than a percentage."""
    return d if c["higher_is_better"] else max(d, LOSS_DECIMALS)


def console_comparisons(report: dict) -> list[str]:
    """The comparison as the console shows it: per pair a line naming the sides, then one
    line per test (difference, CI, p, Holm p, ASO, bootstrap, seeds needed, verdict) and one
    sentence per row that could not be tested."""
    out = []
    tasks, d = report["tasks"], report["decimals"]
    for comparison in report["comparisons"]:
        confidence = f"{100 * comparison['confidence']:g}%"
        out += ["", f"B = {comparison['label_b']} vs A = {comparison['label_a']} "
                    f"({comparison['n_runs_b']} vs {comparison['n_runs_a']} runs):"]
        for c in comparison["tasks"].values():
            scale, digits = c["scale"], _digits(c, d)
            if c["tied"]:  # no spread, no test: the numbers would read nan
                out.append(f"  {row_title(c, tasks)}: mean {fmt(c['mean_a'] * scale, digits)} "
                           f"on both sides ({c['n_b']} vs {c['n_a']} seeds) → {c['verdict']}.")
                continue
            aso = ("tied" if c["tied"] else f"{c['aso_epsilon']:.2f} (A over B "
                   f"{c['aso_epsilon_a_over_b']:.2f})")
            needed = "> 10000" if c["seeds_needed"] is None else str(c["seeds_needed"])
            out.append(
                f"  {row_title(c, tasks)}: B − A {c['difference'] * scale:+.{digits}f} "
                f"[{confidence} CI {fmt(c['ci_low'] * scale, digits)}, "
                f"{fmt(c['ci_high'] * scale, digits)}], p {_p(c['p_value'])}, Holm p "
                f"{_p(c['p_holm'])}, ε_min {aso}, bootstrap "
                f"[{fmt(c['bootstrap_low'] * scale, digits)}, "
                f"{fmt(c['bootstrap_high'] * scale, digits)}], seeds needed {needed} "
                f"({c['n_b']} vs {c['n_a']}) → {c['verdict']}.")
            out += [f"    note: {note}." for note in c["notes"]]
        out += [f"  {label}: not compared: {reason}."
                for label, reason in comparison["skipped"].items()]
    return out


def _aso_cells(c: dict) -> list[str]:
    """ε_min both ways, each with its verdict; "no difference" for tied groups."""
    if c.get("tied"):
        return [TIED, TIED]
    return [f"{c['aso_epsilon']:.2f}" + (" (B better)" if c["b_better_by_aso"] else ""),
            f"{c['aso_epsilon_a_over_b']:.2f}" + (" (A better)" if c["a_better_by_aso"] else "")]


TIED = "no difference (tied)"


def _pair(comparison: dict) -> str:
    """B vs A, each side named by its selection (settings) or its glob."""
    return (f"`{comparison.get('label_b', comparison['glob_b'])}` vs "
            f"`{comparison.get('label_a', comparison['glob_a'])}`")


def _describe(comparison: dict, side: str) -> str:
    return comparison.get(f"describe_{side}", f"runs matching `{comparison[f'glob_{side}']}`")


def _p(value: float | None) -> str:
    return "nan" if value is None or math.isnan(value) else f"{value:.4g}"


def _reference_rows_note(references: dict) -> str:
    if not any(r["tasks_shown"] for r in references["chosen"]):
        return ""
    return (" Reference rows are published scores (one number each), labelled with their "
            "split: a test score is on other examples than bertkit's dev scores.")


def render_distances(references: dict, tasks: dict, d: int) -> list[str]:
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
                     f"{fmt(item['system_mean'], d)} ({item['n_seeds']} seeds)",
                     fmt(item["reference_value"], d), f"{item['difference']:+.{d}f}", note])
    if body:
        out.append(markdown_table(["System", "Reference", "Task", "System (dev)", "Reference",
                                   "System − reference", "Note"], body).rstrip("\n"))
    else:
        out.append("No task of these runs has a reference score.")
    for item in references["skipped"]:
        out.append(f"\n- {item['reference']}, {item['task']}: not compared: {item['reason']}")
    return out + _reference_sources(references)


def _reference_sources(references: dict) -> list[str]:
    """Where each shown reference comes from; named references without a task here."""
    out = []
    shown = [r for r in references["chosen"] if r["tasks_shown"]]
    if shown:
        out += ["", "References:", ""]
        out += [f"- {r['label']} (`{r['key']}`, {r['split']} set): {r['source']}"
                for r in shown]
    if references["requested"] is not None:  # named ones without a task here are said so
        out += [f"\n- `{r['key']}`: no score for the tasks of these runs"
                for r in references["chosen"] if not r["tasks_shown"]]
    return out + [""]
