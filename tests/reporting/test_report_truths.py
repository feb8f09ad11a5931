"""What bertkit-report prints is true: the best grid point shows the epochs a run really
trained, and two arms with the same scores read as no difference, without a library's
warning."""

from __future__ import annotations

import json
import warnings

import pytest

from bertkit.reporting.cli import main
from tests.conftest import tiny_run_overrides
from tests.reporting.test_run_results import glue_metrics, write
from tests.sweeps.test_successive_halving import run_bertkit_in_process


def best_grid_rows(report_dir) -> list[list[str]]:
    """The cells of report.md's "Best grid point per task" rows."""
    section = (report_dir / "report.md").read_text(encoding="utf-8").split(
        "## Best grid point per task")[1].split("\n## ")[0]
    return [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| System")]


@pytest.mark.slow  # one tiny finetune
def test_best_grid_point_shows_the_epochs_a_max_steps_run_trained(glue_dir, vocab_dir,
                                                                 tmp_path, monkeypatch):
    n_train, batch, steps, epochs = 64, 8, 3, 3
    data = glue_dir("wnli", n_train=n_train)
    run_dir = tmp_path / "runs" / "wnli"
    run_bertkit_in_process(monkeypatch, *tiny_run_overrides(
        "wnli", data, vocab_dir, **{"trainer.max_steps": steps,
                                    "trainer.per_device_train_batch_size": batch,
                                    "trainer.num_train_epochs": epochs}),
        f"hydra.run.dir={run_dir}", f"cache_dir={tmp_path / 'cache'}")
    assert main([str(tmp_path / "runs"), "--reference", "none"]) == 0
    ((*_, batch_cell, epochs_cell, seeds, _, _, _),) = best_grid_rows(tmp_path / "runs" /
                                                                   "report")
    # 3 steps of 8 of 64 examples: 0.375 of the 3 epochs the grid point names.
    assert (batch_cell, epochs_cell, seeds) == (str(batch), f"{steps * batch / n_train:g} of "
                                                            f"{epochs}", "1")


def test_epochs_of_records_written_before_they_were_kept(tmp_path):
    """A record without train.epochs: capped by max_steps, the steps over an epoch's steps;
    on a schedule of epochs stopped early, the share of the planned steps."""
    root = tmp_path / "outputs"
    capped = glue_metrics("rte", 1, {"validation": {"accuracy": 0.6}}, batch=32, epochs=3)
    capped["hyperparameters"]["max_steps"] = 3
    capped["train"].update(steps=3, planned_steps=3, examples=2490)  # 78 steps an epoch
    stopped = glue_metrics("mrpc", 1, {"validation": {"f1": 0.8}}, batch=32, epochs=4)
    stopped["train"].update(steps=50, planned_steps=200)  # early stopping at a quarter
    whole = glue_metrics("mrpc", 2, {"validation": {"f1": 0.7}}, batch=16, epochs=2)
    for name, record in (("capped", capped), ("stopped", stopped), ("whole", whole)):
        write(root / name / "metrics.json", record)
    assert main([str(root), "--reference", "none"]) == 0
    epochs = {(row[1], row[3]): row[4] for row in best_grid_rows(root / "report")}
    assert epochs == {("RTE (Acc)", "32"): f"{3 / 78:.3g} of 3",
                      ("MRPC (F1)", "32"): "1 of 4"}
    report = json.loads((root / "report" / "report.json").read_text())
    (system,) = report["systems"]
    assert system["tasks"]["rte"]["epochs_trained"] == [pytest.approx(3 / 78)]


def tied_sweep(root, a_scores, b_scores):
    for arm, scores in (("a", a_scores), ("b", b_scores)):
        for seed, value in enumerate(scores, start=1):
            write(root / arm / f"seed{seed}" / "metrics.json",
                  glue_metrics("rte", seed, {"validation": {"accuracy": value}}))


@pytest.mark.parametrize("paired", [False, True])
def test_tied_arms_read_as_no_difference_without_a_warning(tmp_path, capsys, paired):
    """Both arms at the majority class (the same accuracy every seed): no difference, and
    neither deepsig's division-by-zero warning nor ASO's ε_min of 1 both ways."""
    root = tmp_path / "outputs"
    majority = 0.5270758122743683  # RTE's dev set: 146 of 277 not_entailment
    tied_sweep(root, [majority] * 3, [majority] * 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main([str(root), "--reference", "none", "--compare", "a/*", "b/*",
                     *(["--paired"] if paired else [])]) == 0
    assert [str(w.message) for w in caught] == []
    assert "Division by zero" not in capsys.readouterr().err
    md = (root / "report" / "report.md").read_text(encoding="utf-8")
    (row,) = [line for line in md.split("## Significance")[1].splitlines()
              if line.startswith("| `b/*` vs `a/*`")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[6] == "0.0"  # B − A
    assert cells[11:13] == ["no difference (tied)"] * 2  # ε_min both ways
    assert ("- `b/*` vs `a/*`, rte: tied: both groups have the same scores, so there is no "
            "difference between them (ASO is not run).") in md
    (comparison,) = json.loads((root / "report" / "report.json").read_text())["comparisons"]
    result = comparison["tasks"]["rte"]
    assert result["tied"] is True and result["aso_epsilon"] is None
    assert result["b_better_by_aso"] is False and result["a_better_by_aso"] is False


@pytest.mark.slow  # ASO's bootstrap, twice
def test_arms_with_the_same_scores_in_another_order_are_tied_and_others_are_not(tmp_path):
    root = tmp_path / "outputs"
    tied_sweep(root, [0.60, 0.62, 0.64], [0.64, 0.60, 0.62])
    assert main([str(root), "--reference", "none", "--compare", "a/*", "b/*"]) == 0
    (comparison,) = json.loads((root / "report" / "report.json").read_text())["comparisons"]
    assert comparison["tasks"]["rte"]["tied"] is True
    other = tmp_path / "other"
    tied_sweep(other, [0.60, 0.62, 0.64], [0.60, 0.62, 0.65])
    assert main([str(other), "--reference", "none", "--compare", "a/*", "b/*"]) == 0
    (comparison,) = json.loads((other / "report" / "report.json").read_text())["comparisons"]
    assert comparison["tasks"]["rte"]["tied"] is False
    assert 0 <= comparison["tasks"]["rte"]["aso_epsilon"] <= 1
