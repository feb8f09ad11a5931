"""bertkit-report on a pretraining ablation (issue 61): the pretraining runs are a table of
their own (rows: the arms, named by the settings they differ in), --compare of one factor
tests it at each level of the others on their held-out scores and on the downstream
finetunes, the comparison is printed on the console in sentences, and a run on part of its
data is marked in every output that shows a score. The grid is the sweep's own
(conf/sweep/pretrain_ablation.yaml), written by ablation_runs.py."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pytest

from bertkit.errors import BertkitError
from bertkit.reporting import writer
from bertkit.reporting.cli import main
from bertkit.reporting.collect import collect
from bertkit.reporting.identity import neutral
from bertkit.reporting.pretraining_section import METRIC_LABELS
from bertkit.reporting.results import LAST_WINDOW, PRETRAINING_METRICS
from bertkit.reporting.selection import resolve_key
from bertkit.reporting.statistics import aso_epsilon
from tests.reporting.ablation_runs import (
    arm_name,
    arms,
    grid,
    rte_score,
    scores,
    sentence_task,
    write_ablation,
    write_job,
)
from tests.reporting.test_run_results import glue_metrics, write

SEEDS = (1, 2, 3)
FAST = ["--bootstrap", "200", "--reference", "none"]


@pytest.fixture(autouse=True)
def quick_aso(monkeypatch):
    """ASO with few bootstrap iterations: the numbers are not what these tests check."""
    monkeypatch.setattr(writer, "aso_epsilon", lambda a, b, **kw: aso_epsilon(
        a, b, **{**kw, "bootstrap_iterations": 20}))


@pytest.fixture(scope="module")
def ablation(tmp_path_factory) -> Path:
    return write_ablation(tmp_path_factory.mktemp("ablation") / "sweep", seeds=SEEDS)


def report_of(root: Path, capsys, *args: str) -> tuple[dict, str]:
    out = root.parent / f"report-{abs(hash(args))}"
    assert main([str(root), "--out", str(out), *FAST, *args]) == 0
    console = capsys.readouterr().out
    return json.loads((out / "report.json").read_text()), console


def other_groups(group: str) -> list[str]:
    return [g for g in grid() if g != group]


def levels(group: str) -> list[str]:
    """"objective=mlm" ...: the levels of the other factors a comparison of group is made at."""
    return [" · ".join(f"{g}={v}" for g, v in zip(other_groups(group), values, strict=True))
            for values in itertools.product(*(grid()[g] for g in other_groups(group)))]


def test_pretraining_arms_are_rows_with_their_seeds_pooled(ablation, capsys):
    report, console = report_of(ablation, capsys)
    table = {row["system"]: row for row in report["pretraining"]["systems"]}
    assert set(table) == {arm_name(arm) for arm in arms()}
    for arm in arms():
        row = table[arm_name(arm)]
        assert row["seeds"] == list(SEEDS)
        expected = {m: [scores(arm, s)[m] for s in SEEDS] for m, _ in PRETRAINING_METRICS
                    if m in scores(arm, 1)}
        assert {m: v["values"] for m, v in row["metrics"].items()} == expected
        # the console's pretraining table: the arm's NSP/SOP column is '-' without one
        pretraining_table = console.split("Pretraining (held-out scores):")[1]
        line = next(x for x in pretraining_table.splitlines()
                    if x.startswith(f"| {arm_name(arm)} "))
        assert line.count(" - |") == (0 if sentence_task(arm) else 1)
    # the downstream finetunes: the finetuning table's rows, named as the arms
    rows = {s["system"]: s["tasks"]["rte"]["values"] for s in report["systems"]}
    assert rows == {arm_name(arm): [rte_score(arm, s) for s in SEEDS] for arm in arms()}


def test_a_directory_of_pretraining_runs_alone_is_a_report(tmp_path, capsys):
    root = write_ablation(tmp_path / "sweep", seeds=(1,), downstream=False)
    report, console = report_of(root, capsys)
    assert report["systems"] == []
    assert "Pretraining (held-out scores):" in console
    assert {r["system"] for r in report["pretraining"]["systems"]} == {
        arm_name(arm) for arm in arms()}


@pytest.mark.parametrize("group", sorted(grid()))
def test_a_factor_is_compared_at_each_level_of_the_others(ablation, capsys, group):
    a, b = grid()[group][:2]
    report, console = report_of(ablation, capsys, "--compare", f"{group}={a}", f"{group}={b}")
    (comparison,) = report["comparisons"]
    tested = {(c["task"], c["metric"], c["level"]) for c in comparison["tasks"].values()}
    expected = {("rte", "accuracy", level) for level in levels(group)}
    for level in levels(group):
        arms_at = [arm for arm in arms() if all(
            f"{g}={arm[g]}" in level.split(" · ") for g in other_groups(group))]
        # a score both sides have at that level (NSP only where both arms train NSP)
        both = set.intersection(*({m for m in scores(arm, 1)} for arm in arms_at))
        expected |= {("pretraining", m, level) for m, _ in PRETRAINING_METRICS if m in both}
    assert tested == expected
    for c in comparison["tasks"].values():  # each side: the seeds of one arm at that level
        assert c["n_a"] == c["n_b"] == len(SEEDS)
        assert c["aso_comparisons"] == len(expected)  # Holm and ASO count every test
        assert f" at {c['level']}: B − A " in console
    assert len(tested) == len(comparison["tasks"])


def test_pool_pools_the_levels_when_asked(ablation, capsys):
    report, _ = report_of(ablation, capsys, "--pool", "--compare", "masking=static",
                          "masking=dynamic")
    (comparison,) = report["comparisons"]
    results = {(c["task"], c["metric"]): c for c in comparison["tasks"].values()}
    assert {c["level"] for c in results.values()} == {""}
    arms_per_side = len(arms()) // len(grid()["masking"])
    assert results[("rte", "accuracy")]["n_a"] == arms_per_side * len(SEEDS)
    assert results[("pretraining", "mlm_loss")]["n_b"] == arms_per_side * len(SEEDS)


def test_lower_loss_is_better_in_the_verdict(ablation, capsys):
    """Dynamic masking lowers the made-up MLM loss: B (dynamic) is better, not A."""
    report, console = report_of(ablation, capsys, "--compare", "masking=static",
                                "masking=dynamic")
    losses = [c for c in report["comparisons"][0]["tasks"].values()
              if c["metric"] == "mlm_loss"]
    assert losses and all(c["difference"] < 0 for c in losses)
    for c in losses:
        assert c["verdict"].startswith("masking=dynamic is better (lower MLM loss)")
        assert c["p_holm"] < 1 - c["confidence"]
        assert c["b_better_by_aso"] and not c["a_better_by_aso"]
    assert console.count("→ masking=dynamic is better (lower MLM loss)") == len(losses)


def test_too_few_seeds_is_one_sentence_per_row(tmp_path, capsys):
    root = write_ablation(tmp_path / "sweep", seeds=(1,))
    report, console = report_of(root, capsys, "--compare", "masking=static",
                                "masking=dynamic")
    (comparison,) = report["comparisons"]
    assert comparison["tasks"] == {}
    sentence = "1 seed of each side; the test needs at least 2 per side"
    assert set(comparison["skipped"].values()) == {sentence}
    assert {label.split(" at ")[-1] for label in comparison["skipped"]} == set(
        levels("masking"))
    md = (root.parent / next(p.name for p in root.parent.iterdir()
                             if p.name.startswith("report-")) / "report.md").read_text()
    for text in (md, console):
        assert "No task has runs in both groups" not in text
        assert "compare_groups" not in text
        assert text.count(sentence) == len(comparison["skipped"])


def test_nearly_identical_sides_read_as_a_sentence(tmp_path, capsys):
    """scipy's precision-loss warning becomes the row's note, never printed raw."""
    for seed, (a, b) in enumerate([(0.7, 0.6), (0.7, 0.6), (0.7000000000000001,
                                                             0.6000000000000001)], start=1):
        for name, value in (("a", a), ("b", b)):
            write(tmp_path / "runs" / name / f"s{seed}" / "metrics.json",
                  glue_metrics("rte", seed, {"validation": {"accuracy": value}}))
    report, console = report_of(tmp_path / "runs", capsys, "--compare", "a/*", "b/*")
    captured = capsys.readouterr()
    (result,) = report["comparisons"][0]["tasks"].values()
    assert writer.NEARLY_IDENTICAL in result["notes"]
    assert writer.NEARLY_IDENTICAL in console
    assert "Precision loss" not in console + captured.err


def test_a_side_compared_with_itself_is_refused(ablation, capsys):
    assert main([str(ablation), *FAST, "--compare", "masking=static",
                 "masking=static"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "select the same" in err[0]


def test_hidden_directories_are_not_runs(tmp_path):
    root = write_ablation(tmp_path / "sweep", seeds=(1,))
    arm_dir = next(p for p in sorted(root.iterdir()) if p.is_dir())
    shutil.copytree(arm_dir, root / f".{arm_dir.name}.overwritten-20260101")
    runs, pretraining, failed = collect(root)
    assert not any("overwritten" in str(r.run_dir) for r in [*runs, *pretraining, *failed])
    assert len(pretraining) == len(arms())


def test_a_short_key_never_names_a_result_neutral_setting(ablation):
    """For every key of the runs' configs that is result-neutral and shares its last part
    with one that is not (logger.name and task.name ...), that part never resolves to it:
    not even among the seeds of one arm, where only such keys (a run's W&B name) differ."""
    runs, pretraining, _ = collect(next(p for p in sorted(ablation.iterdir()) if p.is_dir()))
    for population in (runs, pretraining):
        keys = set().union(*(r.config for r in population))
        clashes = {k.rsplit(".", 1)[-1] for k in keys if neutral(k)} & {
            k.rsplit(".", 1)[-1] for k in keys if not neutral(k)}
        assert clashes
        for part in clashes:
            try:
                assert not neutral(resolve_key(part, population)), part
            except BertkitError as err:  # several settings that count: ask for the full key
                named = str(err).split("settings: ")[1].split("; give")[0].split(", ")
                assert not any(map(neutral, named)), str(err)


def test_a_run_without_held_out_scores_is_a_row_of_its_own(tmp_path, capsys):
    arm = arms()[0]
    for seed in SEEDS:
        write_job(tmp_path / "runs" / f"seed{seed}", arm, seed)
    write_job(tmp_path / "runs" / "no-heldout", arm, 9, heldout=False)
    report, console = report_of(tmp_path / "runs", capsys)
    rows = {r["system"]: r["seeds"] for r in report["pretraining"]["systems"]}
    assert len(rows) == 2
    (window,) = [name for name in rows if LAST_WINDOW in name]
    assert rows[window] == [9]
    assert window in console


PARTIAL = {"validation": {"examples": 16, "of": 277}}
MARK = "partial: "


def test_a_partial_run_is_marked_in_every_output_and_never_pooled(tmp_path, capsys,
                                                                  monkeypatch):
    """Every text file the report writes, the figures' legends and the console mark the
    partial runs; their scores are in rows of their own."""
    legends = {}

    def recording(plot):
        def record(series, path, *args, **kwargs):
            legends[Path(path).name] = list(series)
            return plot(series, path, *args, **kwargs)
        return record

    for name in ("plot_seeds", "plot_expected_max"):
        monkeypatch.setattr(writer, name, recording(getattr(writer, name)))
    root = tmp_path / "runs"
    arm = arms()[0]
    for seed in SEEDS:
        write_job(root / "full" / f"seed{seed}", arm, seed, rte=rte_score(arm, seed))
        write_job(root / "cut" / f"seed{seed}", arm, seed, rte=0.9, limited=PARTIAL)
        metrics = root / "cut" / f"seed{seed}" / "downstream" / "rte" / "metrics.json"
        data = json.loads(metrics.read_text())
        data["details"]["limited_samples"] = PARTIAL
        metrics.write_text(json.dumps(data))
    out = tmp_path / "report"
    assert main([str(root), "--out", str(out), *FAST, "--compare", "full/*", "cut/*"]) == 0
    console = capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    written = [p for p in out.iterdir() if p.suffix in (".md", ".csv", ".json")]
    assert {p.name for p in written} == {"report.md", "results.csv", "pretraining.csv",
                                         "report.json"}
    for text in [console, *(p.read_text() for p in written)]:
        assert "16 of 277" in text
    figures = {p.name for p in out.iterdir() if p.suffix == ".png"}
    assert figures and set(legends) == figures
    for names in legends.values():
        assert sum(MARK in name for name in names) == 1
    finetunes = {s["system"]: s["tasks"]["rte"]["values"] for s in report["systems"]}
    assert sorted(finetunes.values()) == sorted(
        [[rte_score(arm, s) for s in SEEDS], [0.9] * len(SEEDS)])
    assert all((MARK in name) == (values == [0.9] * 3) for name, values in finetunes.items())
    arms_rows = [r["system"] for r in report["pretraining"]["systems"]]
    assert len(arms_rows) == 2 and sum(MARK in name for name in arms_rows) == 1
    # a level of its own: never tested against, or chosen among, full runs
    (comparison,) = report["comparisons"]
    assert comparison["tasks"] == {}
    assert comparison["skipped"] and all(MARK in label for label in comparison["skipped"]
                                         if "no run of A" in comparison["skipped"][label])


def test_metric_labels_cover_every_pretraining_score():
    assert set(METRIC_LABELS) == {m for m, _ in PRETRAINING_METRICS}


def test_a_partial_run_is_never_measured_against_a_published_score(tmp_path):
    for name, limited in (("full", None), ("cut", PARTIAL)):
        for seed in SEEDS:
            metrics = glue_metrics("rte", seed, {"validation": {"accuracy": 0.6 + seed / 100}})
            if limited:
                metrics.setdefault("details", {})["limited_samples"] = limited
            write(tmp_path / "runs" / name / f"s{seed}" / "metrics.json", metrics)
    report = writer.build_report(tmp_path / "runs")
    distances = report["references"]["distances"]
    assert distances and not any(MARK in d["system"] for d in distances)
    assert any(MARK in s["reason"] for s in report["references"]["skipped"])


def test_a_cut_whose_whole_was_not_counted_is_named_without_a_total():
    """A pretraining corpus read up to corpus.max_documents records {"of": null}: the row says
    "corpus first 16", never "of None"."""
    from bertkit.reporting.results import partial_marks

    assert partial_marks({"corpus": {"examples": 16, "of": None},
                          "validation": {"examples": 16, "of": 277}}) == (
        "partial: corpus first 16, validation 16 of 277",)
