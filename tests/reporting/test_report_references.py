"""Published reference scores: the packaged file, its checks, the table rows and the distances."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from bertkit.config_tree import config_dir
from bertkit.reporting.cli import main
from bertkit.reporting.references import (
    default_references_path,
    load_references,
    matches_model,
    task_main_metrics,
)
from bertkit.reporting.writer import build_report
from tests.conftest import compose_config
from tests.reporting.test_report_cli import sweep  # noqa: F401 (fixture: mrpc and rte, 3 seeds each)
from tests.reporting.test_run_results import glue_metrics, write

REPO = Path(__file__).resolve().parents[2]
TABLE_1 = {  # Devlin et al. (2019), Table 1, GLUE test server
    "bert_base_paper_test": {"mnli": 84.6, "qqp": 71.2, "qnli": 90.5, "sst2": 93.5,
                             "cola": 52.1, "stsb": 85.8, "mrpc": 88.9, "rte": 66.4},
    "bert_large_paper_test": {"mnli": 86.7, "qqp": 72.1, "qnli": 92.7, "sst2": 94.9,
                              "cola": 60.5, "stsb": 86.5, "mrpc": 89.3, "rte": 70.1},
}


def test_packaged_references_use_real_tasks_and_their_main_metrics():
    path = default_references_path()
    assert path == REPO / "bertkit" / "reporting" / "published_scores.yaml"
    assert not list(Path(config_dir()).rglob("published_scores.yaml"))  # not in Hydra's path
    references = load_references()
    assert len(references) >= 9
    composed = {}
    for reference in references.values():
        assert reference.split in ("dev", "test")
        assert reference.split in reference.label
        for task, metric in reference.metrics.items():
            if task not in composed:  # the task as Hydra composes it, not as the loader reads it
                composed[task] = compose_config([f"task={task}"]).task
            assert composed[task].name == task
            assert metric == composed[task].main_metric, (reference.key, task)
            assert 0.0 <= reference.scores[task] <= 100.0
    assert set(composed) == {"cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte",
                             "wnli", "squad_v1", "squad_v2", "swag", "conll2003"}
    for key, scores in TABLE_1.items():
        assert references[key].scores == scores and references[key].split == "test"
    assert references["bert_base_paper_dev"].scores["squad_v1"] == 88.5
    assert references["bert_large_paper_dev"].scores == {
        "squad_v1": 90.9, "squad_v2": 81.9, "swag": 86.6, "conll2003": 96.6}
    assert references["bert_tiny_turc_test"].split == "test"
    assert "mrpc" not in references["bert_tiny_turc_test"].scores  # unlabelled pair: left out


def test_task_main_metrics_follow_defaults(tmp_path):
    metrics = task_main_metrics()
    assert metrics["squad_v2"] == "f1"  # inherited from squad_v1 through defaults
    assert metrics["mnli"] == "accuracy" and metrics["cola"] == "matthews_correlation"
    assert "base" not in metrics and "standard" not in metrics  # conf/task/glue/: bases
    # through a GLUE base, relative and absolute (@_here_ as the task files write it)
    (tmp_path / "task" / "glue").mkdir(parents=True)
    (tmp_path / "task" / "glue" / "base.yaml").write_text("name: ???\nmain_metric: f1\n")
    (tmp_path / "task" / "glue" / "standard.yaml").write_text(
        "defaults: [/task/glue/base@_here_, _self_]\nmain_metric: ???\n")
    (tmp_path / "task" / "new.yaml").write_text(
        "defaults: [glue/standard@_here_, _self_]\nname: new\n")
    assert task_main_metrics(tmp_path) == {"new": "f1"}


def test_model_matching():
    reference = load_references()["bert_base_paper_test"]
    for model in ("bert-base-uncased", "google-bert/bert-base-uncased",
                  "/models/bert-base-uncased/", "bert-base-cased"):
        assert matches_model(reference, model), model
    for model in ("bert-large-uncased", "bert-base-uncased-finetuned", "from_scratch", ""):
        assert not matches_model(reference, model), model


EXPECTED_TABLE = """\
| System                                    |         MRPC (F1) |         RTE (Acc) | Average |
| ----------------------------------------- | ----------------: | ----------------: | ------: |
| bert-base-uncased                         | 88.0 ± 2.0 (88.0) | 69.0 ± 2.6 (70.0) |    78.5 |
| BERT-base (Devlin et al. 2019, GLUE test) |              88.9 |              66.4 |    77.7 |
"""


def test_reference_row_and_distances_by_hand(sweep, capsys):  # noqa: F811
    """mrpc: mean 88.0 over seeds at 2e-5 vs 88.9 -> -0.9; rte: 69.0 vs 66.4 -> +2.6."""
    assert main([str(sweep)]) == 0  # default: the references whose models match
    out = sweep / "report"
    md = (out / "report.md").read_text(encoding="utf-8")
    assert EXPECTED_TABLE in md
    assert EXPECTED_TABLE in capsys.readouterr().out
    data = json.loads((out / "report.json").read_text())
    assert data["table_markdown"] == EXPECTED_TABLE
    # the matched dev reference (SQuAD, SWAG, ... for BERT-base) has no task here: no row
    chosen = {r["key"]: r for r in data["references"]["chosen"]}
    assert set(chosen) == {"bert_base_paper_test", "bert_base_paper_dev"}
    assert chosen["bert_base_paper_dev"]["tasks_shown"] == []
    assert chosen["bert_base_paper_test"]["tasks_shown"] == ["mrpc", "rte"]
    distances = {d["task"]: d for d in data["references"]["distances"]}
    assert set(distances) == {"mrpc", "rte"}
    assert distances["mrpc"]["system_mean"] == pytest.approx(88.0)
    assert distances["mrpc"]["reference_value"] == 88.9
    assert distances["mrpc"]["difference"] == pytest.approx(-0.9)
    assert distances["rte"]["difference"] == pytest.approx(69.0 - 66.4)
    assert {d["reference_split"] for d in distances.values()} == {"test"}
    assert {d["run_split"] for d in distances.values()} == {"dev"}
    section = md.split("## Distance to reference")[1].split("## Best grid point")[0]
    assert ("| bert-base-uncased | BERT-base (Devlin et al. 2019, GLUE test) | MRPC (F1) "
            "| 88.0 (3 seeds) | 88.9 | -0.9 | reference on test, run on dev |") in section
    assert "| RTE (Acc) | 69.0 (3 seeds) | 66.4 | +2.6 | reference on test, run on dev |" in (
        section)
    assert "Table 1 (GLUE evaluation server)" in section
    # results.csv carries the reference row: one number, no spread
    csv_lines = (out / "results.csv").read_text().splitlines()
    assert csv_lines[2] == ('"BERT-base (Devlin et al. 2019, GLUE test)",88.9,,88.9,1,'
                            f"66.4,,66.4,1,{(88.9 + 66.4) / 2!r}")


def test_reference_none_and_named(sweep, tmp_path):  # noqa: F811
    plain = build_report(sweep, reference_keys=["none"])
    assert plain["table_markdown"].count("\n") == 3  # header, rule, one system
    assert plain["references"]["chosen"] == [] and plain["references"]["file"] is None
    # a named reference is measured against every system, matched or not; two at once
    named = build_report(sweep, reference_keys=["hf_run_glue_bert_base_cased_dev",
                                                "bert_large_paper_test"])
    rows = [line.split("|")[1].strip() for line in named["table_markdown"].splitlines()[2:]]
    assert rows == ["bert-base-uncased",
                    "bert-base-cased (Hugging Face run_glue.py README, dev)",
                    "BERT-large (Devlin et al. 2019, GLUE test)"]
    hf = {d["task"]: d for d in named["references"]["distances"]
          if d["reference"] == "hf_run_glue_bert_base_cased_dev"}
    assert hf["mrpc"]["difference"] == pytest.approx(88.0 - 88.85)
    assert hf["rte"]["difference"] == pytest.approx(69.0 - 65.70)
    assert hf["rte"]["reference_split"] == "dev"


def test_no_matching_model_and_other_main_metric(tmp_path):
    root = tmp_path / "outputs"
    # runs from scratch: no reference matches by model
    write(root / "a" / "metrics.json", {**glue_metrics("rte", 1, {"validation": {
        "accuracy": 0.5}}), "model": "from_scratch"})
    report = build_report(root)
    assert report["references"]["chosen"] == []
    md_section = _distance_section(root, report)
    assert "No reference in `" in md_section and "lists a model of these runs" in md_section
    # MRPC run with accuracy as its main metric: the paper's F1 is not compared
    data = glue_metrics("mrpc", 1, {"validation": {"accuracy": 0.8, "f1": 0.85}})
    data["main_metric"], data["main_value"] = "accuracy", 0.8
    write(root / "b" / "metrics.json", data)
    report = build_report(root, reference_keys=["bert_base_paper_test"])
    assert [d["task"] for d in report["references"]["distances"]] == ["rte"]
    assert report["references"]["skipped"] == [{
        "reference": "bert_base_paper_test", "task": "mrpc",
        "reason": "the reference is f1, the runs' main metric is accuracy"}]


def _distance_section(root, report) -> str:
    from bertkit.reporting.sections import render_markdown

    return render_markdown(report).split("## Distance to reference")[1]


GOOD = {"label": "Mine (dev)", "source": "my notes", "split": "dev", "models": ["m"],
        "scores": {"mrpc": {"metric": "f1", "value": 80.0}}}


@pytest.mark.parametrize("change, message", [
    (lambda e: e.pop("split"), "mine.split: missing"),
    (lambda e: e["scores"]["mrpc"].update(value="eighty"),
     "mine.scores.mrpc.value: 'eighty' is not a score in points"),
    (lambda e: e["scores"]["mrpc"].update(value=0.8 * 1000), "mine.scores.mrpc.value: 800.0"),
    (lambda e: e["scores"].update(mrcp={"metric": "f1", "value": 80.0}),
     "mine.scores.mrcp: unknown task"),
    (lambda e: e["scores"]["mrpc"].update(metric="accuracy"),
     "mine.scores.mrpc.metric: 'accuracy' is not mrpc's main metric (f1)"),
    (lambda e: e["scores"]["mrpc"].pop("metric"), "mine.scores.mrpc.metric: missing"),
    (lambda e: e.update(split="validation"), "mine.split: 'validation' is not one of dev, test"),
    (lambda e: e.update(label="Mine"), "mine.label: 'Mine' does not name its split (dev)"),
    (lambda e: e.update(model=["m"]), "mine.model: unknown key"),
    (lambda e: e.update(models="m"), "mine.models: expected a list of model names"),
])
def test_bad_references_file_is_one_error_naming_file_and_key(sweep, tmp_path, capsys,  # noqa: F811
                                                              change, message):
    entry = json.loads(json.dumps(GOOD))
    change(entry)
    path = tmp_path / "refs.yaml"
    path.write_text(yaml.safe_dump({"mine": entry}))
    assert main([str(sweep), "--references", str(path)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert lines[0].startswith(f"bertkit-report: error: {path}: {message}"), lines[0]
    assert not (sweep / "report").exists()


def test_references_file_errors_and_unknown_keys(sweep, tmp_path, capsys):  # noqa: F811
    path = tmp_path / "refs.yaml"
    path.write_text("mine: {label: [unclosed\n")
    assert main([str(sweep), "--references", str(path)]) == 2
    assert f"{path}: not valid YAML" in capsys.readouterr().err
    assert main([str(sweep), "--references", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml: cannot read the references file" in capsys.readouterr().err
    path.write_text(yaml.safe_dump({"mine": GOOD}))
    assert main([str(sweep), "--references", str(path), "--reference", "yours"]) == 2
    assert "--reference yours: no such reference (known: mine)" in capsys.readouterr().err
    assert main([str(sweep), "--reference", "none", "--reference", "bert_base_paper_test"]) == 2
    assert "--reference none cannot be combined" in capsys.readouterr().err
    # a good file of one's own: used by name
    assert main([str(sweep), "--references", str(path), "--reference", "mine"]) == 0
    data = json.loads((sweep / "report" / "report.json").read_text())
    (distance,) = data["references"]["distances"]
    assert distance["difference"] == pytest.approx(88.0 - 80.0)
    assert distance["reference_split"] == "dev"
