"""The pretraining table of bertkit-report: one row per arm of a pretraining run (rows split
by the settings the runs differ in, identity.RowSplit, as finetunes are), its held-out MLM
loss and accuracy, NSP/SOP accuracy, tokens seen and training time, mean ± std over seeds.

A run without a held-out set (heldout: null) reports its last training window's scores: a
row of its own, named so ("no held-out set: ..."), never pooled with held-out scores.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Sequence
from pathlib import Path

from bertkit.reporting.identity import RowSplit
from bertkit.reporting.results import PRETRAINING_METRICS, PretrainingRun, cut_words
from bertkit.reporting.statistics import summarize
from bertkit.reporting.tables import MISSING, aligned_table, markdown_cell

# How each metric is named in the tables and the comparison's sentences.
METRIC_LABELS = {"mlm_loss": "MLM loss", "mlm_accuracy": "MLM accuracy",
                 "nsp_accuracy": "NSP accuracy", "sop_accuracy": "SOP accuracy"}
HIGHER_IS_BETTER = dict(PRETRAINING_METRICS)
LOSS_DECIMALS = 3  # a cross-entropy in nats: arms of an ablation differ in its 2nd or 3rd


def metric_scale(metric: str) -> float:
    """Accuracies are shown ×100, as finetunes' fractions; a loss as it is (nats)."""
    return 1.0 if metric.endswith("loss") else 100.0


def pretraining_rows(runs: Sequence[PretrainingRun], split: RowSplit,
                     relative: Callable[[Path], str]) -> list[dict]:
    """One entry per arm: its seeds, run directories (relative(path): as the report names
    them) and per metric the values and summary."""
    arms: dict[str, list[PretrainingRun]] = {}
    for run in runs:
        arms.setdefault(split.name(run), []).append(run)
    rows = []
    for name in sorted(arms):
        chosen = sorted(arms[name], key=lambda r: (r.seed, str(r.run_dir)))
        metrics = {}
        for metric, _ in PRETRAINING_METRICS:
            values = [r.scores[metric] for r in chosen if metric in r.scores]
            if values:
                metrics[metric] = {"values": values, "summary": summarize(values),
                                   "higher_is_better": HIGHER_IS_BETTER[metric]}
        extra = {what: summarize(values) if values else None
                 for what, values in (("tokens_seen", [r.tokens_seen for r in chosen
                                                       if r.tokens_seen is not None]),
                                      ("seconds", [r.seconds for r in chosen
                                                   if r.seconds is not None]))}
        rows.append({"system": name, "recipe": chosen[0].recipe, "model": chosen[0].model,
                     "settings": split.differing(chosen[0]),
                     "heldout": chosen[0].heldout,
                     "partial": chosen[0].limited_samples,
                     "seeds": [r.seed for r in chosen],
                     "run_dirs": [relative(r.run_dir) for r in chosen],
                     "metrics": metrics, **extra})
    return rows


def columns(rows: Sequence[dict]) -> list[str]:
    """The metrics some arm has, in PRETRAINING_METRICS' order (NSP only where an arm has
    NSP)."""
    return [m for m, _ in PRETRAINING_METRICS if any(m in r["metrics"] for r in rows)]


def _cell(summary: dict | None, decimals: int, scale: float = 1.0) -> str:
    if summary is None:
        return MISSING
    mean = f"{summary['mean'] * scale:.{decimals}f}"
    return mean if summary["n"] < 2 else f"{mean} ± {summary['std'] * scale:.{decimals}f}"


def tokens(summary: dict | None) -> str:
    if summary is None:
        return MISSING
    value = summary["mean"]
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:.0f}"


def duration(summary: dict | None) -> str:
    if summary is None:
        return MISSING
    seconds = summary["mean"]
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def header(metric: str) -> str:
    direction = "lower is better" if not HIGHER_IS_BETTER[metric] else "%"
    return f"{METRIC_LABELS[metric]} ({direction})"


def pretraining_table(rows: Sequence[dict], decimals: int) -> str:
    """The Markdown table: arm, a column per metric (mean ± std over seeds), seeds, tokens
    seen, training time; '-' where an arm has no such score."""
    metrics = columns(rows)
    head = ["Pretraining arm", *map(header, metrics), "seeds", "tokens seen", "time"]
    body = [[markdown_cell(r["system"])]
            + [_cell(r["metrics"].get(m, {}).get("summary"),
                     LOSS_DECIMALS if m.endswith("loss") else decimals, metric_scale(m))
               for m in metrics]
            + [str(len(r["seeds"])), tokens(r["tokens_seen"]), duration(r["seconds"])]
            for r in rows]
    return aligned_table(head, body)


def pretraining_csv(rows: Sequence[dict]) -> str:
    """The same table as CSV (raw values): system, <metric>_mean/_std/_n, tokens_seen,
    seconds, heldout, partial."""
    metrics = columns(rows)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["system", *(f"{m}_{k}" for m in metrics for k in ("mean", "std", "n")),
                     "tokens_seen", "seconds", "heldout", "partial"])
    for r in rows:
        fields = [" ".join(r["system"].split())]
        for m in metrics:
            s = r["metrics"].get(m, {}).get("summary")
            fields += ["", "", ""] if s is None else [
                repr(s["mean"]), "" if math.isnan(s["std"]) else repr(s["std"]), str(s["n"])]
        fields += [repr(r[k]["mean"]) if r[k] else "" for k in ("tokens_seen", "seconds")]
        fields += [str(r["heldout"]).lower(),
                   "; ".join(cut_words(split, n) for split, n in sorted(r["partial"].items())
                             if isinstance(n, dict))]
        writer.writerow(fields)
    return out.getvalue()


def render_pretraining(report: dict) -> list[str]:
    """report.md's "Pretraining" section (none without pretraining runs)."""
    rows = report["pretraining"]["systems"]
    if not rows:
        return []
    out = ["## Pretraining", "",
           f"{report['pretraining']['n_runs']} pretraining run(s). Scores of each run's final "
           "checkpoint on its held-out set (a row marked 'no held-out set' reports its last "
           "training window instead): mean ± std over seeds; accuracies ×100, the MLM loss "
           "in nats. Rows are split by every setting in which the runs differ, seeds aside; "
           "tokens seen and time are means over seeds.", ""]
    return out + [report["pretraining"]["table_markdown"].rstrip("\n"), ""]
