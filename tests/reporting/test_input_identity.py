"""A run's identity in bertkit-report holds every input by content: for each key the schema
marks as a file or folder a run reads (config_schema.input_keys: data, tokenizer, checkpoint,
corpus), runs that read other content under one path are two rows, named by that input, and
runs that read the same content under two paths are one row. The run records are written with
the fingerprints the run itself computes (the family's reader, model_input_fingerprints,
corpus_input_fingerprints), and read back by the report's own code path."""

from __future__ import annotations

import copy
import json
import os
import shutil
from collections.abc import Callable
from fnmatch import fnmatchcase
from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import DictConfig, OmegaConf, open_dict
from transformers import BertConfig, BertModel

from bertkit.config_schema import input_keys
from bertkit.data import cache as fingerprints
from bertkit.data.cache import file_digest, model_input_fingerprints
from bertkit.data.metrics_file import INPUT_FINGERPRINTS
from bertkit.pretraining.corpora import corpus_input_fingerprints
from bertkit.reporting.cli import main as report_main
from bertkit.reporting.identity import DATA_KEY, PRETRAINING, _patterns
from bertkit.reporting.sections import render_markdown
from bertkit.reporting.writer import build_report
from bertkit.tasks import task_family
from bertkit.training.models import load_tokenizer
from bertkit.training.run import result_header
from tests.conftest import compose_config, tiny_run_overrides
from tests.glue_fixtures import WORDS, write_glue_task
from tests.reporting.test_run_results import glue_metrics

TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", '"', ".", "?"]


# How to write content `variant` (0 or 1) of each input at a path: what a user hands a run.
def _glue_dir(path: Path, variant: int) -> None:
    import random
    write_glue_task("rte", path, 12, 6, 4, random.Random(variant))


def _glue_file(name: str) -> Callable[[Path, int], None]:
    def write(path: Path, variant: int) -> None:
        staging = path.parent / f".{path.name}.glue{variant}"
        _glue_dir(staging, variant)
        path.parent.mkdir(parents=True, exist_ok=True)
        (staging / name).rename(path)
        shutil.rmtree(staging)
    return write


def _vocabulary(path: Path, variant: int) -> None:
    """0: an uncased vocabulary; 1: a cased one (the issue's 30,522 vs 28,996 tokens)."""
    words = sorted(WORDS) if variant == 0 else sorted({*WORDS, *(w.title() for w in WORDS)})
    path.mkdir(parents=True)
    (path / "vocab.txt").write_text("\n".join(TOKENS + words) + "\n")


def _checkpoint(path: Path, variant: int) -> None:
    torch.manual_seed(variant)
    config = BertConfig(vocab_size=len(TOKENS) + len(WORDS), hidden_size=8, num_hidden_layers=1,
                        num_attention_heads=1, intermediate_size=8)
    BertModel(config).save_pretrained(str(path))


def _corpus_file(path: Path, variant: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    documents = [[f"the {w} sat on the mat." for w in WORDS[i:i + 4]] for i in range(0, 16, 4)]
    if variant:
        documents.reverse()
    path.write_text("\n\n".join("\n".join(d) for d in documents) + "\n")


# key -> (how its content is written at a path, the config value naming that path)
INPUTS: dict[str, tuple[Callable[[Path, int], None], Callable[[Path], object]]] = {
    "task.data_dir": (_glue_dir, str),
    "task.train_file": (_glue_file("train.tsv"), str),
    "task.validation_file": (_glue_file("dev.tsv"), str),
    "task.test_file": (_glue_file("test.tsv"), str),
    "model.tokenizer": (_vocabulary, str),
    "model.name_or_path": (_checkpoint, str),
    "corpus.files": (_corpus_file, lambda path: [str(path)]),
    "corpus.parts": (_corpus_file, lambda path: [{"format": "google", "files": [str(path)]}]),
}
PRETRAINING_NODES = ("corpus.",)  # inputs of a pretraining run: its downstream rows compare them


def test_every_input_the_schema_names_is_covered():
    """A key the schema marks as read by a run needs a writer here, so that it is tested."""
    assert set(INPUTS) == set(input_keys())


def write_input(key: str, path: Path, variant: int) -> None:
    """Content `variant` of the input at path; a replaced input is new files (not rewritten in
    place), as a user copies other files to a folder."""
    staging = path.with_name(f".{path.name}.new")
    INPUTS[key][0](staging, variant)
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    staging.rename(path)


def set_key(cfg: DictConfig, key: str, value: object) -> DictConfig:
    cfg = copy.deepcopy(cfg)
    with open_dict(cfg):
        OmegaConf.update(cfg, key, value, merge=False, force_add=True)
    return cfg


def write_yaml(path: Path, cfg: DictConfig) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(OmegaConf.to_container(cfg, resolve=True)))


def record_finetune(run_dir: Path, cfg: DictConfig, value: float) -> None:
    """metrics.json and config.yaml of an RTE finetune, its details as finetune() builds them."""
    splits = task_family(cfg.task.family).read(cfg.task, cfg.data_source)
    tokenizer = load_tokenizer(cfg.model)
    metrics = glue_metrics("rte", int(cfg.seed), {"validation": {"accuracy": value}})
    metrics.update(result_header(cfg.recipe.name, cfg.task, cfg.model, "glue", int(cfg.seed),
                                  value))
    metrics["details"] = {"data_fingerprint": splits.fingerprint(),
                          INPUT_FINGERPRINTS: model_input_fingerprints(cfg.model, tokenizer,
                                                                       cfg.cache_dir)}
    write_yaml(run_dir / "config.yaml", cfg)
    (run_dir / "metrics.json").write_text(json.dumps(metrics))


def record_pretraining(job_dir: Path, cfg: DictConfig, downstream: DictConfig,
                       value: float) -> None:
    """A pretraining job (metrics.json's details as pretrain() builds them) and its RTE
    downstream finetune, whose rows are the pretraining's arms."""
    inputs = {**model_input_fingerprints(cfg.model, None, cfg.cache_dir),
              **corpus_input_fingerprints(cfg.corpus, cfg.cache_dir)}
    write_yaml(job_dir / "config.yaml", cfg)
    (job_dir / "metrics.json").write_text(json.dumps(
        {"recipe": "pretrain", "masking": cfg.masking.kind, "objective": cfg.objective.name,
         "corpus": cfg.corpus.name, "details": {INPUT_FINGERPRINTS: inputs}}))
    finetune = set_key(set_key(downstream, "model.name_or_path", str(job_dir / "model")),
                       "seed", int(cfg.seed))
    write_yaml(job_dir / "downstream" / "rte" / "config.yaml", finetune)
    (job_dir / "downstream" / "rte" / "metrics.json").write_text(json.dumps(glue_metrics(
        "rte", int(cfg.seed), {"validation": {"accuracy": value}})))


class Runs:
    """Runs of one configuration but for one input key, recorded under `root`."""

    def __init__(self, key: str, tmp_path: Path, glue_dir: Path, vocab: Path):
        self.key, self.root = key, tmp_path / "runs"
        self.pretraining = key.startswith(PRETRAINING_NODES)
        finetune = compose_config(tiny_run_overrides("rte", glue_dir, vocab))
        if self.pretraining:
            self.base = compose_config(["recipe=pretrain", "corpus=files",
                                        "corpus.files=[unset]"])
            if key == "corpus.parts":
                self.base = set_key(self.base, "corpus.files", None)
            self.downstream = finetune
        else:
            self.base = finetune

    def record(self, path: Path, seed: int, value: float) -> None:
        cfg = set_key(set_key(self.base, self.key, INPUTS[self.key][1](path)), "seed", seed)
        if self.pretraining:
            record_pretraining(self.root / f"seed{seed}", cfg, self.downstream, value)
        else:
            record_finetune(self.root / f"seed{seed}", cfg, value)

    def report(self) -> dict:
        return build_report(self.root, reference_keys=["none"])


def compared_as(key: str, pretraining: bool) -> str:
    """The setting a report compares an input as: the data's fingerprint for the task's
    files, the key itself (under pretraining. for a pretraining's input) for the others."""
    if any(fnmatchcase(key, pattern) for pattern in _patterns()["data_location"]):
        return DATA_KEY
    return PRETRAINING + key if pretraining else key


def input_path(key: str, tmp_path: Path, name: str) -> Path:
    return tmp_path / name / ("input" if key.endswith(("_dir", "name_or_path", "tokenizer"))
                              else "input.txt")


def rows_of(report: dict) -> dict[str, list[float]]:
    return {s["system"]: sorted(s["tasks"]["rte"]["values"]) for s in report["systems"]}


@pytest.mark.parametrize("key", sorted(INPUTS))
def test_other_content_under_one_path_is_another_row(key, tmp_path, glue_dir, vocab_dir):
    runs = Runs(key, tmp_path, glue_dir("rte"), vocab_dir)
    path = input_path(key, tmp_path, "same")
    for variant, seeds in ((0, (1, 2)), (1, (3, 4))):
        write_input(key, path, variant)
        for seed in seeds:
            runs.record(path, seed, 0.5 + variant / 10 + seed / 100)
    report = runs.report()
    assert sorted(rows_of(report).values()) == [[0.51, 0.52], [0.63, 0.64]]
    assert report["rows_split_by"]["keys"] == [compared_as(key, runs.pretraining)]
    assert f"`{compared_as(key, runs.pretraining)}`" in render_markdown(report)


@pytest.mark.parametrize("key", sorted(INPUTS))
def test_the_same_content_under_two_paths_is_one_row(key, tmp_path, glue_dir, vocab_dir):
    runs = Runs(key, tmp_path, glue_dir("rte"), vocab_dir)
    for name, seeds in (("here", (1, 2)), ("there", (3, 4))):
        path = input_path(key, tmp_path, name)
        write_input(key, path, 0)
        for seed in seeds:
            runs.record(path, seed, 0.5 + seed / 100)
    report = runs.report()
    assert list(rows_of(report).values()) == [[0.51, 0.52, 0.53, 0.54]]
    assert report["rows_split_by"]["keys"] == []


def test_the_row_of_another_checkpoint_under_one_path_names_it(tmp_path, glue_dir, vocab_dir):
    """Two checkpoints saved to one folder: the rows keep the folder's name as the model and
    say that the checkpoint's content differs."""
    runs = Runs("model.name_or_path", tmp_path, glue_dir("rte"), vocab_dir)
    path = tmp_path / "checkpoints" / "my-bert"
    for variant in (0, 1):
        write_input("model.name_or_path", path, variant)
        runs.record(path, variant + 1, 0.6 + variant / 10)
    names = sorted(rows_of(runs.report()))
    assert len(names) == 2
    assert all(name.startswith("my-bert · model.name_or_path=content:") for name in names)


def test_runs_from_before_the_fingerprints_are_compared_by_path(tmp_path, glue_dir, vocab_dir):
    """A run without details.input_fingerprints keeps its paths: two such runs with one path
    pool as before; a run that recorded the tokenizer's content is never pooled with them."""
    runs = Runs("model.tokenizer", tmp_path, glue_dir("rte"), vocab_dir)
    path = input_path("model.tokenizer", tmp_path, "vocab")
    write_input("model.tokenizer", path, 0)
    for seed in (1, 2, 3):
        runs.record(path, seed, 0.5 + seed / 100)
    for seed in (1, 2):  # written before the fingerprints existed
        metrics_file = runs.root / f"seed{seed}" / "metrics.json"
        metrics = json.loads(metrics_file.read_text())
        del metrics["details"][INPUT_FINGERPRINTS]
        metrics_file.write_text(json.dumps(metrics))
    report = runs.report()
    assert sorted(rows_of(report).values()) == [[0.51, 0.52], [0.53]]
    assert report["rows_split_by"]["keys"] == ["model.tokenizer"]


def test_a_file_is_hashed_once_and_again_when_it_changes(tmp_path, monkeypatch):
    """The digest is remembered in the cache by the file's stat: a second run starting from a
    checkpoint of many GB reads none of it; a file written anew is read again."""
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"a" * 1000)
    reads = []
    real = fingerprints.hashlib.file_digest
    monkeypatch.setattr(fingerprints.hashlib, "file_digest",
                        lambda handle, name: reads.append(handle.name) or real(handle, name))
    cache = tmp_path / "cache"
    first = file_digest(weights, cache)
    assert file_digest(weights, cache) == first and len(reads) == 1
    replacement = tmp_path / "new.safetensors"
    replacement.write_bytes(b"b" * 1000)
    os.replace(replacement, weights)
    assert file_digest(weights, cache) != first and len(reads) == 2


@pytest.mark.slow
def test_the_issue_uncased_and_cased_vocabularies_in_one_folder(tmp_path, glue_dir, capsys):
    """The issue's case end to end: two RTE finetunes whose model.tokenizer folder held the
    uncased vocabulary, then the cased one, were one row "over 2 seeds" in bertkit-report;
    now two rows, each named by the tokenizer's content."""
    from bertkit.jobs import run_job

    vocab = tmp_path / "vocab"
    data = glue_dir("rte")
    for seed in (1, 2):
        write_input("model.tokenizer", vocab, seed - 1)
        cfg = compose_config(tiny_run_overrides("rte", data, vocab, seed=seed))
        run_job(cfg, run_dir=tmp_path / "sweep" / f"seed{seed}")
    assert report_main([str(tmp_path / "sweep")]) == 0
    report = json.loads((tmp_path / "sweep" / "report" / "report.json").read_text())
    names = [system["system"] for system in report["systems"]]
    assert len(names) == 2 and all("tokenizer=content:" in name for name in names)
    assert report["rows_split_by"]["keys"] == ["model.tokenizer"]
