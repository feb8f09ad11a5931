"""Every model directory a run writes holds a Hub model card (README.md): each family's tiny
run, its card parsed by huggingface_hub and checked against the run's metrics.json (model-index
values, license, base model, seed, hyperparameters) and its usage snippet run on the saved
model; no absolute path of the machine in it; and trainer.push_to_hub=true uploading the model
with that card through Trainer's push, against a fake Hub."""

from __future__ import annotations

import contextlib
import fnmatch
import io
import json
import re
from collections import defaultdict
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace

import pytest
import transformers.trainer
from huggingface_hub import ModelCard
from hydra.core.hydra_config import HydraConfig

from bertkit.errors import BertkitError
from bertkit.jobs import run_job
from bertkit.pretraining.run import pretrain
from bertkit.training.model_card import (
    LOCAL_PLACEHOLDER,
    build_card,
    finetune_facts,
    portable_path,
    without_absolute_paths,
)
from tests.conftest import compose_config, tiny_run_overrides
from tests.pretraining.test_heldout import tiny_run as tiny_pretraining_run
from tests.tasks.squad.test_squad_features import make_examples
from tests.tasks.squad.test_squad_features import write_vocab as write_squad_vocab
from tests.tasks.squad.test_squad_recipe import squad_overrides, write_squad_json

# The final evaluation only (the card's scores), not the recipes' checkpoint selection.
ONE_EVALUATION = {"trainer.max_steps": 2, "trainer.eval_strategy": "no",
                  "trainer.save_strategy": "no", "trainer.load_best_model_at_end": False}


def read_card(run_dir: Path) -> tuple[ModelCard, dict]:
    card = ModelCard.load(run_dir / "model" / "README.md")
    return card, json.loads((run_dir / "metrics.json").read_text())


def model_index(card: ModelCard) -> dict[str, dict[str, float]]:
    """split -> metric -> value of the card's model-index, as huggingface_hub parses it."""
    results = defaultdict(dict)
    for result in card.data.eval_results or []:
        assert result.metric_name == result.metric_type
        results[result.dataset_split][result.metric_type] = result.metric_value
    return dict(results)


def scores(splits: dict) -> dict[str, dict[str, float]]:
    """metrics.json's scores; integers there are counts (examples, entities, support)."""
    return {split: {k: v for k, v in values.items() if isinstance(v, float)}
            for split, values in splits.items()}


def usage_code(card: ModelCard) -> str:
    """The Python of the card's usage section."""
    usage = card.text.split("## Usage\n", 1)[1]
    return re.search(r"```python\n(.*?)\n```", usage, re.DOTALL).group(1)


def run_usage(card: ModelCard, model_dir: Path) -> str:
    """Runs the card's usage snippet on the saved model (the placeholder made its path);
    returns what it printed."""
    code = usage_code(card)
    assert f'"{LOCAL_PLACEHOLDER}"' in code
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(code.replace(LOCAL_PLACEHOLDER, str(model_dir)), {})  # noqa: S102 - the card's own
    return printed.getvalue()


def check_card(card: ModelCard, metrics: dict, task_type: str, dataset_type: str) -> None:
    """What every finetuning card holds, against metrics.json."""
    data = card.data
    assert model_index(card) == scores({**metrics["validation"], **metrics["test"]})
    assert {r.task_type for r in data.eval_results} == {task_type} == {data.pipeline_tag}
    assert {r.dataset_type for r in data.eval_results} == {dataset_type}
    assert data.license == "apache-2.0" and data.library_name == "transformers"
    assert data.base_model is None  # from scratch
    assert "bertkit" in data.tags and metrics["task"] in data.tags
    body = card.text
    assert f"- seed: {metrics['seed']}\n" in body
    main, value = metrics["main_metric"], metrics["main_value"]
    split = next(iter(metrics["validation"]))  # the main metric's (MNLI: matched)
    assert f"| {split} | {main} | {value:.4f} |" in body
    hyperparameters = metrics["hyperparameters"]
    for name in ("learning_rate", "train_batch_size", "max_steps", "max_seq_length"):
        assert f"| {name} | {json.dumps(hyperparameters[name])} |" in body


def test_glue_card_matches_metrics_and_names_the_command(glue_dir, vocab_dir, tmp_path,
                                                         monkeypatch):
    overrides = tiny_run_overrides("mnli", glue_dir("mnli"), vocab_dir)
    # As under `bertkit`: Hydra's config of the job, whose overrides make the command.
    hydra = HydraConfig.instance()
    monkeypatch.setattr(hydra, "cfg", hydra.cfg)
    hydra.set_config(compose_config(overrides, with_hydra=True))
    run_dir = tmp_path / "run"
    run_job(compose_config(overrides), run_dir)

    card, metrics = read_card(run_dir)
    check_card(card, metrics, "text-classification", "nyu-mll/glue")
    assert set(model_index(card)) == {"validation_matched", "validation_mismatched"}
    assert model_index(card)["validation_matched"].keys() == {"accuracy"}
    assert {r.dataset_config for r in card.data.eval_results} == {"mnli"}
    assert card.data.datasets == ["nyu-mll/glue"]
    assert card.data.model_name == "bertkit-mnli"
    # The command as given, its absolute paths made portable (names of directories here).
    assert f"- command: `bertkit {without_absolute_paths(' '.join(overrides))}`" in card.text
    assert " task.data_dir=mnli " in card.text and " model.tokenizer=vocab " in card.text
    assert "| finetuning.name | full |" in card.text  # nested settings, dotted
    # The usage snippet: a text-classification pipeline on a sentence pair, which names
    # MNLI's classes.
    assert 'pipeline("text-classification", model="path/to/model")' in usage_code(card)
    assert '"text_pair":' in usage_code(card)
    printed = run_usage(card, run_dir / "model")
    assert re.search(r"'label': '(contradiction|entailment|neutral)'", printed)


@pytest.mark.slow  # a SQuAD v2 run
def test_squad_v2_card(tmp_path):
    train, dev = tmp_path / "train.json", tmp_path / "dev.json"
    write_squad_json(train, make_examples(40, seed=1, unanswerable=0.3), "v2.0")
    write_squad_json(dev, make_examples(16, seed=2, unanswerable=0.3), "v2.0")
    vocab = write_squad_vocab(tmp_path / "vocab")
    run_dir = tmp_path / "run"
    run_job(compose_config(squad_overrides("squad_v2", train, dev, vocab, tmp_path,
                                           **ONE_EVALUATION)), run_dir)

    card, metrics = read_card(run_dir)
    check_card(card, metrics, "question-answering", "rajpurkar/squad_v2")
    assert {"exact", "f1", "HasAns_f1", "NoAns_f1", "best_f1"} <= model_index(card)[
        "validation"].keys()
    assert "- command: run from Python" in card.text
    # transformers 5 has no question-answering pipeline: the model class and a span.
    code = usage_code(card)
    assert 'AutoModelForQuestionAnswering.from_pretrained("path/to/model")' in code
    assert "pipeline" not in code
    assert len(run_usage(card, run_dir / "model").splitlines()) == 1


def test_swag_card(swag_run):
    """The SWAG family's shared run (tests.runs.swag_run)."""
    run_dir, _, _ = swag_run

    card, metrics = read_card(run_dir)
    check_card(card, metrics, "multiple-choice", "allenai/swag")
    assert model_index(card) == {"validation": {"accuracy": metrics["main_value"]}}
    assert {r.dataset_config for r in card.data.eval_results} == {"regular"}
    # No pipeline for multiple choice: the model class, and the best of the four endings.
    code = usage_code(card)
    assert "pipeline" not in code
    assert 'AutoModelForMultipleChoice.from_pretrained("path/to/model")' in code
    assert run_usage(card, run_dir / "model").strip() in {
        "He starts to play a song.", "He eats the piano.", "He swims across the room.",
        "He paints the sky."}


def test_ner_card_holds_the_labelled_test_split_too(ner_run):
    """The NER family's shared run (tests.runs.ner_run)."""
    run_dir, _, _ = ner_run

    card, metrics = read_card(run_dir)
    check_card(card, metrics, "token-classification", "lhoestq/conll2003")
    assert set(model_index(card)) == {"validation", "test"}
    assert {"precision", "recall", "f1", "f1_PER"} <= model_index(card)["test"].keys()
    assert "entities" not in model_index(card)["test"]  # a count, not a score
    assert 'pipeline("token-classification", model="path/to/model"' in usage_code(card)
    assert run_usage(card, run_dir / "model").startswith("[")


@pytest.mark.slow
def test_pretraining_card_and_its_downstream_finetune_cards(tmp_path, glue_dir):
    run_dir = tmp_path / "pretrain"
    sst2 = glue_dir("sst2")
    pretrain(compose_config(tiny_pretraining_run(**{
        "downstream.tasks": f"{{sst2: ['task.data_dir={sst2}']}}",
        "downstream.overrides": "['trainer.max_steps=2','trainer.eval_strategy=no',"
                                "'trainer.save_strategy=no']",
        "model_card.license": "mit", "model_card.tags": "[bertkit,demo-corpus]"})), run_dir)

    card, metrics = read_card(run_dir)
    final = metrics["heldout"]["final"]
    assert model_index(card) == {"heldout": {key: final[key] for key in (
        "mlm_loss", "mlm_accuracy", "nsp_loss", "nsp_accuracy")}}
    data = card.data
    assert {r.task_type for r in data.eval_results} == {"fill-mask"} == {data.pipeline_tag}
    assert {r.dataset_name for r in data.eval_results} == {"demo"}
    assert data.license == "mit" and {"bertkit", "demo-corpus", "pretraining"} <= set(data.tags)
    assert data.base_model is None and data.model_name == "bertkit-pretraining-demo"
    assert data.datasets is None  # the generated corpus is no Hub dataset
    assert f"- seed: {metrics['seed']}\n" in card.text
    assert f"| objective | {metrics['hyperparameters']['objective']} |" in card.text
    # Rewritten once the downstream finetunes have run: their scores, in the body.
    downstream = metrics["downstream"]["sst2"]
    assert f"| sst2 | {downstream['main_metric']} | {downstream['main_value']:.4f} |" \
        in card.text

    # The finetune of this checkpoint has its own card; a local path is no Hub base_model.
    finetuned, finetuned_metrics = read_card(run_dir / "downstream" / "sst2")
    check_card(finetuned, finetuned_metrics, "text-classification", "nyu-mll/glue")
    assert "- started from: model (a local checkpoint)\n" in finetuned.text
    assert str(tmp_path) not in str(finetuned) and str(tmp_path) not in str(card)
    assert 'pipeline("fill-mask", model="path/to/model")' in usage_code(card)
    assert "'token_str':" in run_usage(card, run_dir / "model")


@pytest.mark.slow
def test_pretraining_card_without_a_heldout_set_has_no_model_index(tmp_path):
    run_dir = tmp_path / "run"
    pretrain(compose_config(tiny_pretraining_run(**{"heldout.fraction": 0.0})), run_dir)
    card, metrics = read_card(run_dir)
    assert card.data.eval_results is None and card.data.pipeline_tag == "fill-mask"
    assert "No held-out set (heldout.fraction=0)" in card.text
    assert f"- last log mlm_loss: {round(metrics['last_log']['mlm_loss'], 4)}\n" in card.text


@pytest.mark.parametrize(("model", "base_model", "expected"), [
    ("bert-base-uncased", None, "bert-base-uncased"),
    ("google-bert/bert-base-cased", None, "google-bert/bert-base-cased"),
    ("from_scratch", None, None),
    ("LOCAL", None, None),  # a local checkpoint is not a Hub id...
    ("LOCAL", "sentence-transformers/all-MiniLM-L6-v2",  # ...unless the card names one
     "sentence-transformers/all-MiniLM-L6-v2"),
])
def test_base_model_is_a_hub_id_or_absent(model, base_model, expected, tmp_path):
    model = str(tmp_path) if model == "LOCAL" else model
    cfg = compose_config(["task=mrpc", f"model_card.base_model={base_model or 'null'}"])
    record = {"family": "glue", "model": model, "seed": 3, "main_metric": "f1",
              "validation": {"validation": {"f1": 0.5, "accuracy": 0.75}}, "test": {},
              "hyperparameters": {"learning_rate": 2e-5}}
    card = build_card(finetune_facts(cfg, record), cfg.model_card, None)
    parsed = ModelCard(str(card))
    assert parsed.data.base_model == expected
    assert model_index(parsed) == {"validation": {"f1": 0.5, "accuracy": 0.75}}
    started = {"from_scratch": "random initialisation",
               str(tmp_path): f"{tmp_path.name} (a local checkpoint)"}.get(model, model)
    assert f"- started from: {started}\n" in parsed.text


def write_checkpoint(directory: Path, *, card: str | None = None,
                     config: dict | None = None) -> Path:
    """A local checkpoint directory as far as the card reads it: README.md, config.json."""
    directory.mkdir(parents=True)
    if card is not None:
        (directory / "README.md").write_text(card)
    (directory / "config.json").write_text(json.dumps({"model_type": "bert", **(config or {})}))
    return directory


MINILM_CONFIG = {"_name_or_path": "nreimers/MiniLM-L6-H384-uncased"}  # the extracted MiniLM's


@pytest.mark.parametrize(("card", "config", "setting", "expected"), [
    # The extracted all-MiniLM-L6-v2 (model=minilm_l6): no README.md, a Hub id in config.json.
    (None, MINILM_CONFIG, None, "nreimers/MiniLM-L6-H384-uncased"),
    # A checkpoint's own card names its base model (a bertkit or Hub card): it wins.
    ("---\nbase_model: google-bert/bert-base-uncased\nlicense: mit\n---\n# x\n", MINILM_CONFIG,
     None, "google-bert/bert-base-uncased"),
    ("---\nbase_model: [a/one, b/two]\n---\n", None, None, ["a/one", "b/two"]),
    # A card without base_model, a config naming a path: nothing names a Hub model.
    ("---\nlicense: mit\n---\n# x\n", {"_name_or_path": "/home/someone/bert"}, None, None),
    ("no metadata, just text\n", {"_name_or_path": ""}, None, None),
    # model_card.base_model wins over all.
    (None, MINILM_CONFIG, "sentence-transformers/all-MiniLM-L6-v2",
     "sentence-transformers/all-MiniLM-L6-v2"),
])
def test_base_model_of_a_local_checkpoint(card, config, setting, expected, tmp_path):
    checkpoint = write_checkpoint(tmp_path / "all-MiniLM-L6-v2", card=card, config=config)
    cfg = compose_config(["task=mrpc", f"model_card.base_model={setting or 'null'}"])
    record = {"family": "glue", "model": str(checkpoint), "seed": 3, "main_metric": "f1",
              "validation": {"validation": {"f1": 0.5}}, "test": {}, "hyperparameters": {}}
    parsed = ModelCard(str(build_card(finetune_facts(cfg, record),
                                      cfg.model_card, None)))
    assert parsed.data.base_model == expected
    # The body names the checkpoint by its directory, never by this machine's path.
    assert "- started from: all-MiniLM-L6-v2 (a local checkpoint)\n" in parsed.text
    assert "from all-MiniLM-L6-v2." in parsed.text
    assert str(tmp_path) not in str(parsed)


def test_model_card_base_model_must_be_a_hub_id(glue_dir, vocab_dir, tmp_path):
    cfg = compose_config(tiny_run_overrides("rte", glue_dir("rte"), vocab_dir, **{
        "model_card.base_model": str(tmp_path / "bert")}))
    with pytest.raises(BertkitError, match=r"model_card.base_model=.*: expected the Hub id"):
        run_job(cfg, tmp_path / "run")


@pytest.mark.slow  # a run
def test_no_absolute_path_in_the_card(glue_dir, vocab_dir, tmp_path, monkeypatch):
    """A run whose config is full of absolute paths (a checkpoint in $HOME, the data, the
    tokenizer, the cache, all given on the command line): the card shows their names."""
    from transformers import BertConfig, BertModel

    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    assert Path.home() == home
    vocab_size = len((vocab_dir / "vocab.txt").read_text().split())
    checkpoint = home / "models" / "tiny-bert"
    BertModel(BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=2, intermediate_size=64)).save_pretrained(checkpoint)
    overrides = tiny_run_overrides("mrpc", glue_dir("mrpc"), vocab_dir, **{
        "model.name_or_path": str(checkpoint),
        "model.tokenizer": str(vocab_dir), "cache_dir": str(home / ".cache" / "bertkit"),
        "trainer.max_steps": 2})
    hydra = HydraConfig.instance()
    monkeypatch.setattr(hydra, "cfg", hydra.cfg)
    hydra.set_config(compose_config(overrides, with_hydra=True))
    cfg = compose_config(overrides)
    run_dir = tmp_path / "run"
    run_job(cfg, run_dir)

    text = (run_dir / "model" / "README.md").read_text()
    for path in (str(tmp_path), str(home), "/tmp/", "/root/", "/home/"):
        assert path not in text, path
    card = ModelCard(text)
    assert card.data.base_model is None  # a local checkpoint naming no Hub model
    assert "- started from: tiny-bert (a local checkpoint)\n" in card.text
    assert " model.name_or_path=tiny-bert " in card.text
    assert " task.data_dir=mrpc " in card.text and " cache_dir=bertkit`" in card.text


def test_portable_paths():
    cwd = Path.cwd()
    assert portable_path(str(cwd / "outputs" / "run" / "model")) == "outputs/run/model"
    assert portable_path("/somewhere/else/data/glue/MRPC") == "MRPC"
    assert portable_path("~/.cache/bertkit/models/all-MiniLM-L6-v2") == "all-MiniLM-L6-v2"
    assert without_absolute_paths({"a": ["/x/y/z", "1/2", "https://huggingface.co/a/b"],
                                   "b": "task.data_dir=/x/y/mrpc [/p/q, /r/s]", "c": 3}) == {
        "a": ["z", "1/2", "https://huggingface.co/a/b"], "b": "task.data_dir=mrpc [q, s]",
        "c": 3}


@pytest.mark.parametrize(("warmup", "shown", "hidden"), [
    ({"warmup_ratio": 0.1, "warmup_steps": 0.1}, "| warmup_ratio | 0.1 |", "warmup_steps"),
    ({"warmup_ratio": None, "warmup_steps": 10000}, "| warmup_steps | 10000 |", "warmup_ratio"),
    ({"warmup_ratio": None, "warmup_steps": 0}, "| warmup_steps | 0 |", "warmup_ratio"),
])
def test_warm_up_is_one_line_of_the_hyperparameters(warmup, shown, hidden):
    cfg = compose_config(["task=mrpc"])
    record = {"family": "glue", "model": "bert-base-uncased", "seed": 3, "main_metric": "f1",
              "validation": {"validation": {"f1": 0.5}}, "test": {},
              "hyperparameters": {"learning_rate": 2e-5, **warmup, "weight_decay": 0.01}}
    text = build_card(finetune_facts(cfg, record), cfg.model_card, None).text
    assert shown in text and hidden not in text
    assert "| learning_rate | 2e-05 |" in text and "| weight_decay | 0.01 |" in text


@pytest.mark.slow  # a run
def test_no_card_with_model_card_disabled(glue_dir, vocab_dir, tmp_path):
    run_dir = tmp_path / "run"
    run_job(compose_config(tiny_run_overrides("rte", glue_dir("rte"), vocab_dir,
                                              **{"model_card.enabled": False})), run_dir)
    assert (run_dir / "model" / "config.json").exists()
    assert not (run_dir / "model" / "README.md").exists()


# The push, through Trainer's own push_to_hub against a fake Hub


class FakeHub:
    """HfApi's create_repo and upload_folder as transformers.trainer calls them; each upload
    keeps what the folder held then (less the ignore patterns), as the Hub would get it."""

    def __init__(self, fail_on: str | None = None):
        self.repos: list[str] = []
        self.uploads: list[dict] = []
        self.fail_on = fail_on

    def create_repo(self, repo_id, **kwargs):
        if self.fail_on == "create_repo":
            raise ConnectionError("Name or service not known")
        self.repos.append(repo_id)
        return SimpleNamespace(repo_id=repo_id)

    def upload_folder(self, *, repo_id, folder_path, commit_message, run_as_future=False,
                      ignore_patterns=(), **kwargs):
        if self.fail_on == "upload_folder":
            raise ConnectionError("Name or service not known")
        folder = Path(folder_path)
        files = {}
        for path in sorted(folder.rglob("*")):
            name = path.relative_to(folder).as_posix()
            if path.is_file() and not any(fnmatch.fnmatch(name, p) for p in ignore_patterns):
                files[name] = path.read_bytes()
        self.uploads.append({"repo_id": repo_id, "message": commit_message, "files": files})
        if run_as_future:
            future = Future()
            future.set_result("commit")
            return future
        return "commit"


def use_fake_hub(monkeypatch, hub: FakeHub) -> None:
    """Trainer's Hub calls go to `hub`: through hf_api() (newer transformers), or
    huggingface_hub's functions imported into transformers.trainer (older ones)."""
    if hasattr(transformers.trainer, "hf_api"):
        monkeypatch.setattr(transformers.trainer, "hf_api", lambda: hub)
    else:
        monkeypatch.setattr(transformers.trainer, "create_repo", hub.create_repo)
        monkeypatch.setattr(transformers.trainer, "upload_folder", hub.upload_folder)


def push_overrides(glue_dir, vocab_dir, **extra) -> list[str]:
    return tiny_run_overrides("mrpc", glue_dir("mrpc"), vocab_dir, **{
        "trainer.push_to_hub": True, "trainer.hub_model_id": "someone/tiny-mrpc", **extra})


@pytest.mark.slow  # a run per strategy
@pytest.mark.parametrize(("strategy", "saves"), [("every_save", [2, 4]), ("end", [])])
def test_push_uploads_the_model_with_the_bertkit_card(strategy, saves, glue_dir, vocab_dir,
                                                      tmp_path, monkeypatch):
    hub = FakeHub()
    use_fake_hub(monkeypatch, hub)
    run_dir = tmp_path / "run"
    run_job(compose_config(push_overrides(glue_dir, vocab_dir, **{
        "trainer.save_strategy": "steps", "trainer.save_steps": 2,
        "+trainer.hub_strategy": strategy})), run_dir)

    assert hub.repos == ["someone/tiny-mrpc"]
    # Trainer's checkpoint pushes (hub_strategy every_save), then bertkit's one push at the
    # end; saving <run>/model pushed nothing ("Model save"), and no upload ever carried
    # Trainer's draft card.
    *during, final = hub.uploads
    assert [u["message"] for u in during] == [f"Training in progress, step {step}"
                                              for step in saves]
    assert all("README.md" not in u["files"] for u in during)
    assert final["repo_id"] == "someone/tiny-mrpc" and final["message"].startswith("bertkit")
    files = final["files"]
    assert not any(name.startswith("checkpoint-") for name in files)
    # What the model directory holds went up as it is: weights, config, tokenizer, and the
    # card with its model-index.
    model_files = {path.name: path.read_bytes() for path in (run_dir / "model").iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "README.md"} <= set(
        model_files)
    assert {name: files.get(name) for name in model_files} == model_files
    text = files["README.md"].decode()
    card, metrics = ModelCard(text), json.loads((run_dir / "metrics.json").read_text())
    check_card(card, metrics, "text-classification", "nyu-mll/glue")
    assert card.data.model_name == "tiny-mrpc"
    # Pushed: the usage snippet names the model by its Hub id.
    assert 'pipeline("text-classification", model="someone/tiny-mrpc")' in usage_code(card)
    assert LOCAL_PLACEHOLDER not in card.text


def test_push_needs_a_hub_model_id(glue_dir, vocab_dir, tmp_path):
    cfg = compose_config(push_overrides(glue_dir, vocab_dir, **{"trainer.hub_model_id": "null"}))
    with pytest.raises(BertkitError, match=r"trainer.push_to_hub=true needs "
                                           r"trainer.hub_model_id=<user>/<name>"):
        run_job(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()  # refused before the run starts


def test_an_unreachable_hub_is_one_message_before_training(glue_dir, vocab_dir, tmp_path,
                                                           monkeypatch):
    use_fake_hub(monkeypatch, FakeHub("create_repo"))
    with pytest.raises(BertkitError, match=r"cannot create or reach the Hub repository "
                                           r"trainer.hub_model_id=someone/tiny-mrpc "
                                           r"\(ConnectionError"):
        run_job(compose_config(push_overrides(glue_dir, vocab_dir)), tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.json").exists()


@pytest.mark.slow  # a run
def test_a_failed_upload_names_the_saved_model_and_card(glue_dir, vocab_dir, tmp_path,
                                                        monkeypatch):
    use_fake_hub(monkeypatch, FakeHub("upload_folder"))
    run_dir = tmp_path / "run"
    model_dir = run_dir / "model"
    with pytest.raises(BertkitError, match=rf"pushing to someone/tiny-mrpc failed .*saved in "
                                           rf"{model_dir}: upload them with `hf upload "
                                           rf"someone/tiny-mrpc {model_dir}`"):
        run_job(compose_config(push_overrides(glue_dir, vocab_dir)), run_dir)
    assert (run_dir / "metrics.json").exists()
    assert model_index(ModelCard.load(model_dir / "README.md"))
