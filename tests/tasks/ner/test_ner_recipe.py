"""recipe=ner end to end on generated CoNLL files with a tiny BERT: metrics.json, prediction
files that rescore to the reported numbers, checkpoints chosen by entity F1, IOB1 input with
document context and all-sub-token labels, the feature-based mode's frozen encoder, resuming,
the errors a user meets first, the config tree, and a run on the real CoNLL-2003 files."""

from __future__ import annotations

import functools
import json

import pytest
from safetensors.torch import load_file
from seqeval.metrics import f1_score, precision_score, recall_score

from bertkit.errors import BertkitError
from bertkit.jobs import run_job
from bertkit.tasks.ner import family as ner_finetune
from bertkit.training.trainer import BertkitTrainer
from tests.conftest import compose_config, real_data_dir, tiny_checkpointed_training
from tests.ner_fixtures import (
    LABELS,
    conll_text,
    make_sentences,
    read_columns,
    to_iob1,
    write_vocab,
)
from tests.wandb_records import read_offline_run

SEEDS = {"train": 1, "validation": 2, "test": 3}  # of each split's generated sentences


@pytest.fixture
def conll_files(tmp_path):
    return functools.partial(write_conll_files, tmp_path)


def write_conll_files(directory, n_train: int = 48, n_dev: int = 16, n_test: int = 12,
                      iob1: bool = False):
    """split -> (its file under directory/conll, its sentences)."""
    files = {}
    for split, n in (("train", n_train), ("validation", n_dev), ("test", n_test)):
        seed = SEEDS[split]
        sentences = make_sentences(n, seed)
        if iob1:
            sentences = [list(zip([w for w, _ in s], to_iob1([t for _, t in s]),
                                  strict=True)) for s in sentences]
        path = directory / "conll" / f"{split}.txt"
        path.parent.mkdir(exist_ok=True)
        path.write_text(conll_text(sentences))
        files[split] = (path, make_sentences(n, seed))
    return files


def ner_overrides(files, vocab, tmp_path, **extra) -> list[str]:
    overrides = {
        "recipe": "ner",
        "task.train_file": str(files["train"][0]),
        "task.validation_file": str(files["validation"][0]),
        "task.test_file": str(files["test"][0]),
        **tiny_checkpointed_training(vocab, tmp_path / "cache"),
        "model.do_lower_case": False,
        **extra,
    }
    return [f"{key}={value}" for key, value in overrides.items()]


def rescore(path):
    """seqeval on the tag columns of a prediction file, read without bertkit's code."""
    columns = read_columns(path)
    gold = [[fields[1] for fields in s] for s in columns]
    predicted = [[fields[2] for fields in s] for s in columns]
    return columns, {"precision": precision_score(gold, predicted, zero_division=0),
                     "recall": recall_score(gold, predicted, zero_division=0),
                     "f1": f1_score(gold, predicted, zero_division=0)}


def test_tiny_finetune_writes_predictions_that_rescore_to_the_metrics(ner_run):
    run_dir, summary, files = ner_run

    assert json.loads((run_dir / "metrics.json").read_text()) == summary
    assert summary["main_metric"] == "f1" and summary["train"]["steps"] == 40
    assert summary["details"]["data"]["train"]["sentences"] == 48
    assert summary["details"]["data"]["validation"]["tag_scheme"] == "iob2"
    for section, split in (("validation", "validation"), ("test", "test")):
        reported = summary[section][split]
        columns, scores = rescore(run_dir / "predictions" / f"{split}.txt")
        # Every sentence and word of the input, in order, with its gold tag.
        expected = files[split][1]
        assert [[f[0] for f in s] for s in columns] == [[w for w, _ in s] for s in expected]
        assert [[f[1] for f in s] for s in columns] == [[t for _, t in s] for s in expected]
        for key, value in scores.items():
            assert reported[key] == pytest.approx(value), (split, key)
        assert reported["entities"] == sum(t.startswith("B-") for s in expected for _, t in s)
    # The generated entities are easy: 40 steps learn them.
    assert summary["validation"]["validation"]["f1"] > 0.5
    assert summary["main_value"] == summary["validation"]["validation"]["f1"]
    config = json.loads((run_dir / "model" / "config.json").read_text())
    assert config["id2label"] == {str(i): label for i, label in enumerate(LABELS)}


def test_offline_wandb_run_holds_the_entity_scores(ner_run):
    run_dir, summary, _ = ner_run
    (offline,) = (run_dir / "wandb").glob("offline-run-*")
    logged = read_offline_run(offline)
    # The evaluation's entity scores during training, and the final ones of both splits.
    assert "eval/f1" in logged["summary"] and "eval/f1_PER" in logged["summary"]
    assert logged["summary"]["final/test/f1"] == pytest.approx(summary["test"]["test"]["f1"])
    assert logged["summary"]["final/validation/recall"] == pytest.approx(
        summary["validation"]["validation"]["recall"])
    config = logged["config"]
    assert config["label_all_subtokens"] is False and config["document_context"] is False
    assert config["learning_rate"] == pytest.approx(5e-3) and config["max_seq_length"] == 128
    assert config["bertkit"]["task"]["name"] == "conll2003"
    assert logged["group"] == "ner-conll2003"
    assert {"recipe:ner", "task:conll2003"} <= set(logged["tags"])


@pytest.mark.slow  # a run
def test_checkpoints_are_selected_by_entity_f1(conll_files, tmp_path, monkeypatch):
    """With F1 0.1, 0.3, 0.2 at steps 2, 4, 6 the run keeps step 4's weights."""
    from bertkit.tasks.ner import metrics as ner_metrics

    schedule = iter([0.1, 0.3, 0.2])
    real_scores = ner_metrics.entity_scores
    monkeypatch.setattr(ner_metrics, "entity_scores",
                        lambda *a: {**real_scores(*a), "f1": next(schedule)})
    files = conll_files()
    run_dir = tmp_path / "run"
    summary = run_job(compose_config(ner_overrides(
        files, write_vocab(tmp_path / "vocab"), tmp_path)), run_dir)
    assert summary["details"]["best_checkpoint"].endswith("checkpoint-4")
    best = load_file(f"{summary['details']['best_checkpoint']}/model.safetensors")
    final = load_file(str(run_dir / "model" / "model.safetensors"))
    assert all((best[key] == final[key]).all() for key in best)


@pytest.mark.slow  # a run
def test_iob1_files_with_document_context_and_all_subtokens(conll_files, tmp_path):
    files = conll_files(iob1=True)
    assert " I-PER\n" in files["train"][0].read_text()
    run_dir = tmp_path / "run"
    summary = run_job(compose_config(ner_overrides(
        files, write_vocab(tmp_path / "vocab"), tmp_path,
        **{"task.document_context": True, "task.label_all_subtokens": True,
           "task.max_seq_length": 48, "trainer.eval_strategy": "no",
           "trainer.save_strategy": "no", "trainer.load_best_model_at_end": False})), run_dir)
    data = summary["details"]["data"]
    assert {data[s]["tag_scheme"] for s in ("train", "validation", "test")} == {"iob1"}
    assert summary["hyperparameters"]["document_context"] is True
    assert summary["details"]["data"]["train"]["features"] == 48  # one target per sentence
    columns, scores = rescore(run_dir / "predictions" / "validation.txt")
    # The gold column is IOB2: the IOB1 input, converted.
    assert [[f[1] for f in s] for s in columns] == [[t for _, t in s]
                                                    for s in files["validation"][1]]
    assert summary["validation"]["validation"]["f1"] == pytest.approx(scores["f1"])


@pytest.mark.slow  # a run
def test_feature_based_run_trains_the_tagger_only(conll_files, tmp_path, monkeypatch):
    created = {}
    real_load = ner_finetune.load_tagger

    def recording_load(*args):
        model = real_load(*args)
        created["initial"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        created["modes"] = modes = []
        model.encoder.register_forward_pre_hook(
            lambda module, _: modes.append((model.training, module.training)))
        return model

    monkeypatch.setattr(ner_finetune, "load_tagger", recording_load)
    files = conll_files()
    run_dir = tmp_path / "run"
    summary = run_job(compose_config(ner_overrides(
        files, write_vocab(tmp_path / "vocab"), tmp_path, experiment="ner_feature_based",
        **{"model.config.num_hidden_layers": 4, "model.feature_based.lstm_hidden_size": 16,
           "trainer.eval_strategy": "no", "trainer.save_strategy": "no",
           "trainer.load_best_model_at_end": False})), run_dir)

    final = load_file(str(run_dir / "model" / "model.safetensors"))
    initial = created["initial"]
    assert final.keys() == initial.keys()
    encoder = [k for k in final if k.startswith("encoder.")]
    tagger = [k for k in final if not k.startswith("encoder.")]
    assert encoder and all(k.startswith(("lstm.", "classifier.")) for k in tagger)
    assert all(final[k].equal(initial[k]) for k in encoder)
    assert all(not final[k].equal(initial[k]) for k in tagger)
    # Training steps ran with the tagger in train mode and the encoder in eval mode.
    assert (True, False) in created["modes"]
    assert not any(encoder_training for _, encoder_training in created["modes"])
    fb = summary["hyperparameters"]["feature_based"]
    assert fb["enabled"] and fb["layers"] == "concat_last_four" and fb["classifier"] == "bilstm"
    hyperparameters = summary["hyperparameters"]
    assert hyperparameters["num_trainable_parameters"] == sum(final[k].numel() for k in tagger)
    assert hyperparameters["num_parameters"] == sum(v.numel() for v in final.values())
    assert hyperparameters["hidden_dropout_prob"] == 0.0  # the encoder never drops out
    assert (run_dir / "model" / "feature_based_tagger.json").is_file()
    _, scores = rescore(run_dir / "predictions" / "test.txt")
    assert summary["test"]["test"]["f1"] == pytest.approx(scores["f1"])


class Interrupted(Exception):
    pass


@pytest.mark.slow  # two runs
def test_resume_continues_an_interrupted_run(conll_files, tmp_path, monkeypatch):
    files = conll_files()
    overrides = ner_overrides(files, write_vocab(tmp_path / "vocab"), tmp_path, **{
        "trainer.max_steps": 6, "trainer.eval_strategy": "no",
        "trainer.load_best_model_at_end": False, "trainer.save_total_limit": 2})
    original_step = BertkitTrainer.training_step
    calls = {"n": 0}

    def interrupt_after_three_steps(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:
            raise Interrupted
        return original_step(self, *args, **kwargs)

    monkeypatch.setattr(BertkitTrainer, "training_step", interrupt_after_three_steps)
    run_dir = tmp_path / "run"
    with pytest.raises(Interrupted):
        run_job(compose_config(overrides), run_dir=run_dir)
    assert not (run_dir / "metrics.json").exists()
    assert (run_dir / "checkpoints" / "checkpoint-2").is_dir()
    calls["n"] = -100
    summary = run_job(compose_config(overrides + ["resume=true"]), run_dir=run_dir)
    assert calls["n"] == -100 + 4  # steps 3..6 only
    assert summary["train"]["steps"] == 6


def test_bad_file_stops_before_training_and_names_the_line(conll_files, tmp_path):
    files = conll_files()
    path = files["validation"][0]
    lines = path.read_text().split("\n")
    lines[4] = lines[4].rsplit(" ", 1)[0] + " B-FOO"
    path.write_text("\n".join(lines))
    cfg = compose_config(ner_overrides(files, write_vocab(tmp_path / "vocab"), tmp_path))
    with pytest.raises(BertkitError, match=rf"^{path}, line 5: tag 'B-FOO' is not one of"):
        run_job(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.json").exists()


def test_settings_are_checked_before_any_data_is_read(tmp_path):
    absent = tmp_path / "absent.txt"
    for override, message in (("task.tag_scheme=bio", "task.tag_scheme='bio'"),
                              ("task.max_seq_length=2", "task.max_seq_length=2"),
                              ("task.labels=[O,B-PER]", "no I-PER"),
                              ("model.feature_based.enabled=true",
                               "concat_last_four needs at least 4 encoder layers")):
        cfg = compose_config(["recipe=ner", "logger=none", "model=scratch_tiny", override,
                              f"task.train_file={absent}"])
        with pytest.raises(BertkitError, match=message):
            run_job(cfg, tmp_path / "run")


def test_hub_data_without_network_points_to_the_files(tmp_path, monkeypatch):
    import datasets
    import huggingface_hub

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # Read at import time: an earlier test may have imported them already.
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    cfg = compose_config(["recipe=ner", "logger=none", "model=scratch_tiny",
                          f"model.tokenizer={write_vocab(tmp_path / 'vocab')}"])
    with pytest.raises(BertkitError, match=r"conll2003.*Without network, give the files in "
                                           r"the CoNLL format: task.data_dir="):
        run_job(cfg, tmp_path / "run")


@pytest.mark.parametrize(("recipe", "task", "message"), [
    ("ner", "mrpc", "task=mrpc is a glue task, but recipe=ner runs ner tasks"),
    ("glue", "conll2003", "task=conll2003 is a ner task, but recipe=glue runs glue tasks"),
])
def test_a_task_of_another_family_is_refused(recipe, task, message):
    with pytest.raises(BertkitError, match=message):
        run_job(compose_config([f"recipe={recipe}", f"task={task}"]))


def test_ner_recipe_composes_with_the_paper_settings():
    cfg = compose_config(["recipe=ner"])
    assert cfg.recipe.name == "ner" and cfg.recipe.task_family == "ner"
    assert cfg.task.name == "conll2003" and cfg.task.family == "ner"
    assert list(cfg.task.labels) == LABELS
    assert cfg.model.name_or_path == "bert-base-cased" and cfg.model.do_lower_case is False
    expected = {"learning_rate": 5e-5, "per_device_train_batch_size": 32,
                "num_train_epochs": 3, "warmup_steps": 0.1, "weight_decay": 0.01,
                "adam_epsilon": 1e-6, "max_grad_norm": 1.0, "metric_for_best_model": "f1",
                "load_best_model_at_end": True}
    for key, value in expected.items():
        assert cfg.trainer[key] == value, key
    task = cfg.task
    assert task.max_seq_length == 128 and task.main_metric == "f1"
    assert task.tag_scheme == "auto" and not task.label_all_subtokens
    assert not task.document_context
    assert dict(task.files) == {"train": "train.txt", "validation": "valid.txt",
                                "test": "test.txt"}
    assert task.hub.path == "lhoestq/conll2003" and task.hub.columns.tags == "ner_tags"
    assert cfg.model.feature_based.enabled is False
    # The feature-based preset: the paper's best Table 7 setting, only the tagger's rate.
    preset = compose_config(["experiment=ner_feature_based", "model=bert_large_cased"])
    assert preset.recipe.task_family == "ner" and preset.model.feature_based.enabled is True
    assert preset.model.feature_based.layers == "concat_last_four"
    assert preset.model.feature_based.classifier == "bilstm"
    assert preset.model.feature_based.lstm_hidden_size == 768
    assert preset.model.feature_based.lstm_layers == 2
    assert preset.model.name_or_path == "bert-large-cased"
    assert preset.trainer.learning_rate == 1e-3


@pytest.mark.slow
@pytest.mark.real_data
def test_real_conll2003_run(tmp_path):
    """A few steps of a tiny BERT on the real files with the bert-base-cased vocabulary."""
    root = real_data_dir()
    run_dir = tmp_path / "run"
    cfg = compose_config([
        "recipe=ner", f"task.data_dir={root / 'conll2003'}", "model=scratch_tiny",
        f"model.tokenizer={root / 'vocab' / 'bert-base-cased'}", "model.do_lower_case=false",
        "logger=none", f"cache_dir={tmp_path / 'cache'}", "trainer.max_steps=4",
        "trainer.per_device_eval_batch_size=256", "trainer.eval_strategy=no",
        "trainer.save_strategy=no", "trainer.load_best_model_at_end=false",
        "trainer.disable_tqdm=true"])
    summary = run_job(cfg, run_dir)
    data = summary["details"]["data"]
    counts = {split: data[split]["sentences"] for split in data}
    assert counts == {"train": 14041, "validation": 3250, "test": 3453}
    assert summary["validation"]["validation"]["entities"] == 5942
    assert summary["test"]["test"]["entities"] == 5648
    for split, sentences in (("validation", 3250), ("test", 3453)):
        columns, scores = rescore(run_dir / "predictions" / f"{split}.txt")
        assert len(columns) == sentences
        section = "validation" if split == "validation" else "test"
        assert summary[section][split]["f1"] == pytest.approx(scores["f1"])
    assert (run_dir / "model" / "model.safetensors").is_file()
