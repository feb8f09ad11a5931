"""recipe=squad end to end on generated SQuAD-format JSON files with a tiny BERT: the official
files it writes (predictions.json, null_odds.json), scores that equal an independent rescoring
of those files, checkpoint selection by F1, the v2.0 threshold sweep against a brute force,
and the errors a user meets first."""

from __future__ import annotations

import json
from collections import defaultdict

import datasets
import pytest

from bertkit.errors import BertkitError
from bertkit.jobs import run_job
from bertkit.tasks.squad.files import read_squad_json
from bertkit.tasks.squad.metrics import squad_v1_scores, squad_v2_scores
from tests.conftest import compose_config, tiny_checkpointed_training
from tests.tasks.squad.test_squad_features import SETTINGS, make_examples, write_vocab


def write_squad_json(path, examples: datasets.Dataset, version: str) -> None:
    """The official layout: data[].title, paragraphs[].context, qas[] with answers."""
    paragraphs = defaultdict(list)
    for row in examples:
        qa = {"id": row["id"], "question": row["question"],
              "answers": [{"text": t, "answer_start": s} for t, s in
                          zip(row["answers"]["text"], row["answers"]["answer_start"],
                              strict=True)]}
        if version == "v2.0":
            qa["is_impossible"] = not row["answers"]["text"]
        paragraphs[row["context"]].append(qa)
    data = [{"title": "generated",
             "paragraphs": [{"context": c, "qas": qas} for c, qas in paragraphs.items()]}]
    path.write_text(json.dumps({"version": version.lstrip("v"), "data": data}))


@pytest.fixture
def squad_files(tmp_path):
    def make(version: str, n_train: int = 40, n_dev: int = 16):
        unanswerable = 0.3 if version == "v2.0" else 0.0
        train, dev = tmp_path / "train.json", tmp_path / "dev.json"
        write_squad_json(train, make_examples(n_train, seed=1, unanswerable=unanswerable),
                         version)
        write_squad_json(dev, make_examples(n_dev, seed=2, unanswerable=unanswerable), version)
        return train, dev

    return make


def squad_overrides(task: str, train, dev, vocab, tmp_path, **extra) -> list[str]:
    overrides = {
        "recipe": "squad",
        "task": task,
        "task.train_file": str(train),
        "task.validation_file": str(dev),
        **{f"task.{key}": value for key, value in SETTINGS.items()},
        **tiny_checkpointed_training(vocab, tmp_path / "cache"),
        **extra,
    }
    return [f"{key}={value}" for key, value in overrides.items()]


def test_tiny_v1_finetune_writes_official_files_whose_scores_match(squad_files, tmp_path,
                                                                  capsys):
    from tests.wandb_records import read_offline_run

    train, dev = squad_files("v1.1")
    vocab = write_vocab(tmp_path / "vocab")
    run_dir = tmp_path / "run"
    summary = run_job(compose_config(squad_overrides("squad_v1", train, dev, vocab, tmp_path,
                                                     logger="wandb")),
                      run_dir=run_dir)

    assert json.loads((run_dir / "metrics.json").read_text()) == summary
    examples = read_squad_json(dev, version="v1.1")
    predictions = json.loads((run_dir / "predictions.json").read_text())
    assert list(predictions) == list(examples["id"])  # every question, in file order
    for qid, context in zip(examples["id"], examples["context"], strict=True):
        assert predictions[qid] and predictions[qid] in context
    rescored = squad_v1_scores(predictions, examples)
    scores = summary["validation"]["validation"]
    assert scores["exact_match"] == pytest.approx(rescored["exact_match"])
    assert scores["f1"] == pytest.approx(rescored["f1"])
    assert summary["main_metric"] == "f1" and summary["details"]["version"] == "v1.1"
    assert summary["main_value"] == scores["f1"]
    assert not (run_dir / "null_odds.json").exists()
    assert summary["files"] == {"predictions": str(run_dir / "predictions.json")}
    assert summary["details"]["evaluation"]["questions"] == 16
    # long passages need several windows
    assert summary["details"]["evaluation"]["windows"] > 16
    assert summary["train"]["steps"] == 6
    assert summary["train"]["questions"] == 40
    assert summary["train"]["windows"] > 40
    assert {key: summary["hyperparameters"][key] for key in (
        "doc_stride", "max_query_length", "n_best_size", "max_answer_length",
        "max_seq_length")} == {"doc_stride": 16, "max_query_length": 12, "n_best_size": 20,
                               "max_answer_length": 30, "max_seq_length": 64}
    assert (run_dir / "model" / "config.json").is_file()
    assert (run_dir / "model" / "tokenizer_config.json").is_file()
    printed = capsys.readouterr().out
    decode_seconds = summary["details"]["evaluation"]["decode_seconds"]
    assert (f"(exact_match {scores['exact_match']:.2f}, f1 {scores['f1']:.2f}; 16 questions "
            f"decoded in {decode_seconds:.2f} s)") in printed
    assert f"predictions: {run_dir / 'predictions.json'}" in printed
    (offline,) = (run_dir / "wandb").glob("offline-run-*")
    logged = read_offline_run(offline)
    assert logged["summary"]["final/validation/f1"] == pytest.approx(scores["f1"])
    assert logged["summary"]["final/validation/exact_match"] == pytest.approx(
        scores["exact_match"])
    assert logged["config"]["doc_stride"] == 16


@pytest.mark.slow  # a SQuAD v2 run
def test_tiny_v2_finetune_thresholds_and_sweeps_like_the_official_script(squad_files,
                                                                         tmp_path):
    train, dev = squad_files("v2.0")
    vocab = write_vocab(tmp_path / "vocab")
    run_dir = tmp_path / "run"
    threshold = -0.5
    cfg = compose_config(squad_overrides(
        "squad_v2", train, dev, vocab, tmp_path,
        **{"task.null_score_diff_threshold": threshold, "task.write_nbest": True}))
    summary = run_job(cfg, run_dir=run_dir)

    examples = read_squad_json(dev, version="v2.0")
    assert sum(not a["text"] for a in examples["answers"]) > 0
    predictions = json.loads((run_dir / "predictions.json").read_text())
    odds = json.loads((run_dir / "null_odds.json").read_text())
    spans = json.loads((run_dir / "best_span_predictions.json").read_text())
    nbest = json.loads((run_dir / "nbest_predictions.json").read_text())
    assert list(predictions) == list(odds) == list(spans) == list(examples["id"])
    for qid in predictions:
        # "" exactly where the null score beats the best span by more than the threshold.
        assert predictions[qid] == ("" if odds[qid] > threshold else spans[qid])
        assert spans[qid] != ""
        assert nbest[qid][0]["text"] in (spans[qid], "")
    assert summary["files"] == {name: str(run_dir / f"{name}.json") for name in (
        "predictions", "null_odds", "best_span_predictions", "nbest_predictions")}
    reported = summary["validation"]["validation"]
    # evaluate-v2.0.py on predictions.json with --na-prob-file null_odds.json.
    official = squad_v2_scores(predictions, examples, odds, null_threshold=threshold)
    for key in ("exact", "f1", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1"):
        assert reported[key] == pytest.approx(official[key])
    assert reported["total"] == 16

    # best_f1: a brute force over every threshold, each applied to the best spans.
    def f1_at(t: float) -> float:
        answers = {qid: "" if odds[qid] > t else spans[qid] for qid in spans}
        return squad_v2_scores(answers, examples)["f1"]

    candidates = [min(odds.values()) - 1, *odds.values()]
    assert reported["best_f1"] == pytest.approx(max(f1_at(t) for t in candidates))
    assert reported["best_f1"] == pytest.approx(f1_at(reported["best_f1_thresh"]))


@pytest.mark.slow  # a run
def test_checkpoints_are_selected_by_f1(squad_files, tmp_path, monkeypatch):
    """With F1 10, 30, 20 at steps 2, 4, 6 the run keeps step 4: its weights are the final
    model, and its scores the final ones (Hugging Face's run_qa.py cannot select by F1)."""
    from safetensors.torch import load_file

    from bertkit.tasks.squad import family as squad_finetune

    real_evaluator = squad_finetune.answer_evaluator
    schedule = iter([10.0, 30.0, 20.0])

    def scheduled_evaluator(*args):
        evaluate = real_evaluator(*args)

        def scores(start, end):
            values, answers = evaluate(start, end)
            return {**values, "f1": next(schedule, values["f1"])}, answers

        return scores

    monkeypatch.setattr(squad_finetune, "answer_evaluator", scheduled_evaluator)
    train, dev = squad_files("v1.1")
    run_dir = tmp_path / "run"
    summary = run_job(compose_config(squad_overrides(
        "squad_v1", train, dev, write_vocab(tmp_path / "vocab"), tmp_path)), run_dir=run_dir)

    best_checkpoint = summary["details"]["best_checkpoint"]
    assert best_checkpoint.endswith("checkpoint-4")
    best = load_file(f"{best_checkpoint}/model.safetensors")
    final = load_file(str(run_dir / "model" / "model.safetensors"))
    assert best.keys() == final.keys()
    assert all((best[key] == final[key]).all() for key in best)
    # The final scores are those of the reloaded step-4 model, rescored from its files.
    predictions = json.loads((run_dir / "predictions.json").read_text())
    rescored = squad_v1_scores(predictions, read_squad_json(dev, version="v1.1"))
    assert summary["validation"]["validation"]["f1"] == pytest.approx(rescored["f1"])


@pytest.mark.parametrize(("recipe", "task", "message"), [
    ("squad", "mrpc", "task=mrpc is a glue task, but recipe=squad runs squad tasks"),
    ("glue", "squad_v1", "task=squad_v1 is a squad task, but recipe=glue runs glue tasks"),
])
def test_a_task_of_another_family_is_refused(recipe, task, message):
    cfg = compose_config([f"recipe={recipe}", f"task={task}"])
    with pytest.raises(BertkitError, match=message):
        run_job(cfg)


def test_missing_release_file_names_the_key_and_the_file(tmp_path):
    (tmp_path / "train-v1.1.json").write_text("{}")
    cfg = compose_config(["recipe=squad", f"task.data_dir={tmp_path}", "logger=none",
                          f"cache_dir={tmp_path / 'cache'}"])
    with pytest.raises(BertkitError, match=r"task.data_dir: .*dev-v1.1.json not found"):
        run_job(cfg, run_dir=tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.json").exists()


def test_window_settings_are_checked_before_any_data_is_read(tmp_path):
    cfg = compose_config(["recipe=squad", "task.doc_stride=400", "logger=none",
                          f"task.train_file={tmp_path / 'absent.json'}"])
    with pytest.raises(BertkitError, match="task.doc_stride=400"):
        run_job(cfg, run_dir=tmp_path / "run")


def test_hub_data_without_network_points_to_the_json_files(tmp_path, hub_offline):
    cfg = compose_config(["recipe=squad", "task=squad_v2", "logger=none", "model=scratch_tiny",
                          f"model.tokenizer={write_vocab(tmp_path / 'vocab')}"])
    with pytest.raises(BertkitError, match="task.train_file=<path to train-v2.0.json>"):
        run_job(cfg, run_dir=tmp_path / "run")
