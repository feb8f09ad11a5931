"""bertkit-report end to end on a fabricated sweep whose numbers were worked out by hand."""

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from deepsig import aso
from scipy import stats

from bertkit.reporting.cli import main
from bertkit.reporting.statistics import summarize
from tests.reporting.test_run_results import glue_metrics, write

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# glue/<task>/<lr>/seed<n>: 2 tasks x 2 grid points x 3 seeds
SCORES = {
    # mrpc: 2e-5 -> 86 88 90: 88.0 ± 2.0 (88.0), best; 3e-5 -> 85 87 83: mean 85.0
    ("mrpc", 2e-5): [0.86, 0.88, 0.90],
    ("mrpc", 3e-5): [0.85, 0.87, 0.83],
    # rte: 2e-5 -> mean 62.0; 3e-5 -> 66 70 71: 69.0 ± sqrt(7) = 2.6 (70.0), best
    ("rte", 2e-5): [0.60, 0.64, 0.62],
    ("rte", 3e-5): [0.66, 0.70, 0.71],
}
BEST = {"mrpc": 2e-5, "rte": 3e-5}
FAILED_ERROR = "CUDA out of memory. Tried to allocate 2.00 GiB"


def lr_dir(lr: float) -> str:
    return f"lr{lr:g}"


@pytest.fixture
def sweep(tmp_path):
    root = tmp_path / "outputs"
    for (task, lr), values in SCORES.items():
        for seed, value in enumerate(values, start=1):
            main_metric = "f1" if task == "mrpc" else "accuracy"
            write(root / "glue" / task / lr_dir(lr) / f"seed{seed}" / "metrics.json",
                  glue_metrics(task, seed, {"validation": {main_metric: value}}, lr=lr))
    write(root / "glue" / "mrpc" / "lr5e-05" / "seed1" / "failed.json", {"error": FAILED_ERROR})
    return root


def run_report(sweep, *extra):
    assert main([str(sweep), *extra]) == 0
    return sweep / "report"


def test_report_files_and_numbers(sweep, capsys):
    out = run_report(sweep)
    printed = capsys.readouterr().out
    md = (out / "report.md").read_text(encoding="utf-8")

    # the failed job is listed with its error
    assert "## Failed jobs" in md
    assert f"- `glue/mrpc/lr5e-05/seed1`: {FAILED_ERROR}" in md
    assert "1 failed job(s)" in printed
    assert "12 finished run(s) and 1 failed job(s) under" in md
    assert "runs read 12 from metrics.json (--source auto)." in md

    # Table 1: one row (nothing but the grid and seeds differs), named by its model; the best
    # grid point per task; average 78.5
    row = next(line for line in md.splitlines()
               if line.startswith("| bert-base-uncased "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells == ["bert-base-uncased", "88.0 ± 2.0 (88.0)", "69.0 ± 2.6 (70.0)",
                     "78.5"]
    assert "MRPC (F1)" in md and "RTE (Acc)" in md
    assert row in printed and str(out / "report.md") in printed

    # best grid point section names the learning rate chosen on dev
    best_rows = [line for line in md.split("## Best grid point per task")[1].splitlines()
                 if line.startswith("| bert-base")]
    assert [r.split("|")[3].strip() for r in best_rows] == ["2e-05", "3e-05"]

    # results.csv parses and carries the same numbers in full; the runs' model is
    # bert-base-uncased, so the paper's BERT-base row follows
    # (tests/reporting/test_report_references.py)
    csv_row, reference_row = list(csv.DictReader(io.StringIO((out / "results.csv").read_text())))
    assert reference_row["system"] == "BERT-base (Devlin et al. 2019, GLUE test)"
    assert float(csv_row["mrpc_mean"]) == pytest.approx(88.0)
    assert float(csv_row["mrpc_std"]) == pytest.approx(2.0)
    assert float(csv_row["rte_median"]) == pytest.approx(70.0)
    assert float(csv_row["rte_std"]) == pytest.approx(7 ** 0.5)
    assert csv_row["mrpc_n"] == csv_row["rte_n"] == "3"
    assert float(csv_row["average"]) == pytest.approx(78.5)

    # report.json: the raw values at the best point, and summarize() of them
    data = json.loads((out / "report.json").read_text())
    (system,) = data["systems"]
    for task, lr in BEST.items():
        best = system["tasks"][task]
        assert best["grid_point"] == {"learning_rate": lr, "train_batch_size": 32,
                                      "num_train_epochs": 3.0}
        assert best["values"] == SCORES[(task, lr)]
        assert best["summary"] == summarize(SCORES[(task, lr)])
        assert best["grid_points_tried"] == 2 and best["runs_tried"] == 6
        assert best["expected_max"][0] == pytest.approx(
            sum(SCORES[(task, 2e-5)] + SCORES[(task, 3e-5)]) / 6)
        assert best["expected_max"][-1] == max(SCORES[(task, 2e-5)] + SCORES[(task, 3e-5)])
    assert data["failed"] == [{"run_dir": "glue/mrpc/lr5e-05/seed1", "error": FAILED_ERROR}]
    assert data["comparisons"] == []

    # figures: valid PNGs of real size, and no temp files left behind
    for task in ("mrpc", "rte"):
        for kind in ("expected_max", "seeds"):
            png = (out / f"{kind}_{task}.png").read_bytes()
            assert png.startswith(PNG_MAGIC) and len(png) > 5000
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


@pytest.mark.slow
def test_compare_is_welch_on_the_two_groups(sweep, capsys):
    out = run_report(sweep, "--compare", "glue/*/lr2e-05/*", "glue/*/lr3e-05/*",
                     "--decimals", "2", "--out", str(sweep / "rep"))
    assert out != sweep / "rep" and (sweep / "rep" / "report.md").exists()
    data = json.loads((sweep / "rep" / "report.json").read_text())
    (comparison,) = data["comparisons"]
    assert (comparison["n_runs_a"], comparison["n_runs_b"]) == (6, 6)
    md = (sweep / "rep" / "report.md").read_text(encoding="utf-8")
    assert "## Significance" in md
    for task in ("mrpc", "rte"):
        a, b = SCORES[(task, 2e-5)], SCORES[(task, 3e-5)]
        result = comparison["tasks"][task]
        expected = stats.ttest_ind(b, a, equal_var=False)
        assert result["p_value"] == pytest.approx(expected.pvalue, rel=1e-12)
        assert result["test"] == "Welch's t-test"
        assert result["difference"] == pytest.approx(sum(b) / 3 - sum(a) / 3)
        assert result["ci_low"] < result["difference"] < result["ci_high"]
        assert f"{expected.pvalue:.4g}" in md
    # mrpc: B - A = 85 - 88 = -3.00 at 2 decimals
    assert "| MRPC (F1) | 3 | 3 | 88.00 | 85.00 | -3.00 |" in md


@pytest.mark.slow
def test_repeated_compare_corrects_over_every_row(sweep, capsys):
    """Two arms against baselines: three rows (two tasks, then one), Holm and ASO's
    Bonferroni counted over all three, as a methods table needs."""
    arm = [0.89, 0.93, 0.92]
    for seed, value in enumerate(arm, start=1):
        write(sweep / "arm" / "mrpc" / f"seed{seed}" / "metrics.json",
              glue_metrics("mrpc", seed, {"validation": {"f1": value}}))
    out = run_report(sweep, "--compare", "glue/*/lr2e-05/*", "glue/*/lr3e-05/*",
                     "--compare", "glue/mrpc/lr2e-05/*", "arm/*", "--decimals", "2")
    first, second = json.loads((out / "report.json").read_text())["comparisons"]
    rows = {("lr", "mrpc"): (SCORES[("mrpc", 2e-5)], SCORES[("mrpc", 3e-5)]),
            ("lr", "rte"): (SCORES[("rte", 2e-5)], SCORES[("rte", 3e-5)]),
            ("arm", "mrpc"): (SCORES[("mrpc", 2e-5)], arm)}
    p = {key: stats.ttest_ind(b, a, equal_var=False).pvalue for key, (a, b) in rows.items()}
    # Holm by its definition: the i-th smallest of m = 3 times (m - i + 1), then the running
    # maximum in that order
    order = sorted(p, key=p.get)
    factors = [3, 2, 1]
    holm, running = {}, 0.0
    for key, factor in zip(order, factors, strict=True):
        running = max(running, min(1.0, factor * p[key]))
        holm[key] = running
    results = {("lr", t): first["tasks"][t] for t in ("mrpc", "rte")}
    results[("arm", "mrpc")] = second["tasks"]["mrpc"]
    assert set(second["tasks"]) == {"mrpc"} and second["n_runs_b"] == 3
    for key, result in results.items():
        a, b = rows[key]
        assert result["p_value"] == pytest.approx(p[key], rel=1e-12)
        assert result["p_holm"] == pytest.approx(holm[key], rel=1e-12)
        assert result["aso_comparisons"] == 3
        assert result["aso_epsilon"] == pytest.approx(aso(
            b, a, confidence_level=0.95, num_comparisons=3, show_progress=False, seed=0))
        assert result["aso_epsilon_a_over_b"] == pytest.approx(aso(
            a, b, confidence_level=0.95, num_comparisons=3, show_progress=False, seed=0))
        assert result["a_better_by_aso"] == (result["aso_epsilon_a_over_b"] < 0.2)
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "| `arm/*` vs `glue/mrpc/lr2e-05/*` | MRPC (F1) | 3 | 3 | 88.00 | 91.33 | 3.33 |" in md
    assert md.count("| `glue/*/lr3e-05/*` vs `glue/*/lr2e-05/*` |") == 2


@pytest.mark.slow
def test_compare_paired_by_seed_with_a_chosen_confidence(sweep, capsys):
    out = run_report(sweep, "--compare", "glue/*/lr2e-05/*", "glue/*/lr3e-05/*", "--paired",
                     "--confidence", "0.9", "--decimals", "2")
    (comparison,) = json.loads((out / "report.json").read_text())["comparisons"]
    assert comparison["paired"] is True and comparison["confidence"] == 0.9
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "| 90% CI (t) |" in md and "| Holm p |" in md and "| ε_min (ASO) |" in md
    assert "| ε_min, A over B |" in md
    p_values = {task: stats.ttest_rel(SCORES[(task, 3e-5)], SCORES[(task, 2e-5)]).pvalue
                for task in ("mrpc", "rte")}
    low, high = sorted(p_values, key=p_values.get)
    for task in ("mrpc", "rte"):
        a, b = SCORES[(task, 2e-5)], SCORES[(task, 3e-5)]  # seeds 1, 2, 3 in order
        result = comparison["tasks"][task]
        assert result["p_value"] == pytest.approx(stats.ttest_rel(b, a).pvalue, rel=1e-12)
        # Holm over the table's two tasks: the smaller p times 2, the larger times 1 (and
        # never below the smaller's adjusted value)
        holm = {low: min(1, 2 * p_values[low])}
        holm[high] = max(holm[low], p_values[high])
        assert result["p_holm"] == pytest.approx(holm[task], rel=1e-12)
        # ASO by deepsig itself, B over A, two comparisons, the report's seed
        assert result["aso_epsilon"] == pytest.approx(aso(
            b, a, confidence_level=0.9, num_comparisons=2, show_progress=False, seed=0))
        assert result["bootstrap_low"] <= result["difference"] <= result["bootstrap_high"]
        assert result["test"] == "paired t-test"
        differences = [y - x for x, y in zip(a, b, strict=True)]
        mean = sum(differences) / 3
        sd = (sum((d - mean) ** 2 for d in differences) / 2) ** 0.5
        half = stats.t.ppf(0.95, df=2) * sd / 3 ** 0.5  # two-sided 90%: the 95th percentile
        assert result["ci_low"] == pytest.approx(mean - half, rel=1e-9)
        assert result["ci_high"] == pytest.approx(mean + half, rel=1e-9)


def test_compare_glob_without_runs_is_an_error(sweep, capsys):
    assert main([str(sweep), "--compare", "nothing/*", "glue/*"]) == 2
    assert "'nothing/*' matches no run directory" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["empty", "missing", "only_failed"])
def test_no_runs_exits_2_with_one_line(tmp_path, capsys, where):
    target = tmp_path / where
    if where == "empty":
        target.mkdir()
    if where == "only_failed":  # the failure is named, even in the one error line
        write(target / "job" / "failed.json", {"error": "data error:\n  boom\nValueError: x"})
    assert main([str(target)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("bertkit-report: error: ")
    assert "Traceback" not in captured.err and captured.out == ""
    assert not (target / "report").exists()
    if where == "only_failed":
        assert lines[0].endswith("1 failed job(s), the first job: data error: boom ValueError: x")


@pytest.mark.slow
def test_console_script_on_an_empty_directory(tmp_path):
    script = Path(sys.executable).parent / "bertkit-report"
    if not script.exists():
        pytest.skip("bertkit-report is not installed in this environment")
    result = subprocess.run([str(script), str(tmp_path)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"bertkit-report: error: {tmp_path}: no finetuning or pretraining runs found "
        "(no metrics.json, no finished W&B run log)"]
