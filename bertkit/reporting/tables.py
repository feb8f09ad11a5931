"""GLUE results as tables shaped like Table 1 of Devlin et al. (2019), for bertkit-report.

One row per system (recipe, model, ablation arm), one column per task with its metric in the
header, cells "mean ± std (median)" over seeds, and an Average column. The text is exact and
deterministic, so a table can be compared byte for byte and diffed between reports.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence

from bertkit.reporting.statistics import summarize

TASK_NAMES = {
    "cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B", "qqp": "QQP",
    "mnli": "MNLI", "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI",
}
METRIC_NAMES = {
    "accuracy": "Acc", "f1": "F1", "matthews_correlation": "MCC", "pearson": "Pearson",
    "spearman": "Spearman",
}
MISSING = "-"

Rows = Mapping[str, Mapping[str, Sequence[float]]]


def one_line(text: object) -> str:
    """text with its line breaks and runs of spaces as single spaces."""
    return " ".join(str(text).split())


def markdown_cell(text: object) -> str:
    """A value as one Markdown table cell: on one line, its pipes escaped."""
    return one_line(text).replace("|", "\\|")


def column_header(task: str, metric: str | None = None) -> str:
    """"MRPC (F1)": the paper's task name and a short metric name; unknown names as given."""
    name = TASK_NAMES.get(task, task)
    return f"{name} ({METRIC_NAMES.get(metric, metric)})" if metric else name


def _summaries(rows: Rows, tasks: Sequence[str], scale: float):
    """[(system, [summary or None per task], average or None)], scores multiplied by scale.

    The average is the mean of the task means, only when every task has a score: an average
    over a different set of tasks would not be comparable between rows.
    """
    table = []
    for system, scores in rows.items():
        cells = []
        for task in tasks:
            values = scores.get(task)
            cells.append(summarize([v * scale for v in values]) if values else None)
        present = [c["mean"] for c in cells if c is not None]
        average = math.fsum(present) / len(present) if present and len(present) == len(
            cells) else None
        table.append((system, cells, average))
    return table


def _format_cell(summary: dict | None, decimals: int) -> str:
    if summary is None:
        return MISSING
    if summary["n"] == 1:  # no seed variance to show
        return f"{summary['mean']:.{decimals}f}"
    return (f"{summary['mean']:.{decimals}f} ± {summary['std']:.{decimals}f} "
            f"({summary['median']:.{decimals}f})")


def glue_table_markdown(
    rows: Rows,
    tasks: Sequence[str],
    metrics: Mapping[str, str] | None = None,
    decimals: int = 1,
    scale: float = 100.0,
    system_header: str = "System",
) -> str:
    """A Markdown table: rows {system: {task: [score per seed]}} in their given order.

    tasks: the columns, in order. metrics: {task: metric name} for the headers ("MRPC (F1)").
    Scores are multiplied by scale (GLUE metrics are fractions; the paper shows percent).
    Cells are "mean ± std (median)" with `decimals` decimals, just the mean for one seed, and
    "-" for a task without scores; the Average (mean of the task means) is "-" then too.
    Columns are padded to one width; numbers are right-aligned. Ends with a newline.
    """
    metrics = metrics or {}
    header = [system_header] + [column_header(t, metrics.get(t)) for t in tasks] + ["Average"]
    body = [[markdown_cell(system)] + [_format_cell(c, decimals) for c in cells]
            + [MISSING if average is None else f"{average:.{decimals}f}"]
            for system, cells, average in _summaries(rows, tasks, scale)]
    return aligned_table(header, body)


def aligned_table(header: list[str], body: list[list[str]]) -> str:
    """A Markdown table padded to one width per column, the first column left-aligned and
    the others (numbers) right-aligned. Ends with a newline."""
    widths = [max(len(line[col]) for line in [header] + body) for col in range(len(header))]

    def line(cells: list[str]) -> str:
        padded = [cell.ljust(widths[0]) if col == 0 else cell.rjust(widths[col])
                  for col, cell in enumerate(cells)]
        return "| " + " | ".join(padded) + " |"

    rule = "| " + " | ".join(["-" * widths[0]] + ["-" * (w - 1) + ":" for w in widths[1:]])
    return "\n".join([line(header), rule + " |"] + [line(b) for b in body]) + "\n"


def glue_table_csv(
    rows: Rows,
    tasks: Sequence[str],
    decimals: int | None = None,
    scale: float = 100.0,
    system_header: str = "system",
) -> str:
    """The same table as CSV: system, then <task>_mean, _std, _median, _n per task, average.

    Numbers are rounded to `decimals` when given, else written in full (repr). A missing
    task, a std of a single seed and an incomplete average are empty fields.
    """
    def number(x: float | None) -> str:
        if x is None or math.isnan(x):
            return ""
        return repr(float(x)) if decimals is None else f"{x:.{decimals}f}"

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([system_header]
                    + [f"{t}_{k}" for t in tasks for k in ("mean", "std", "median", "n")]
                    + ["average"])
    for system, cells, average in _summaries(rows, tasks, scale):
        fields = [one_line(system)]  # a CSV row is one line of the file
        for c in cells:
            fields += (["", "", "", ""] if c is None else
                       [number(c["mean"]), number(c["std"]), number(c["median"]), str(c["n"])])
        writer.writerow(fields + [number(average)])
    return out.getvalue()
