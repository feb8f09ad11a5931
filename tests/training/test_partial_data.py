"""A score on part of the data is marked wherever a score goes (bertkit.data.metrics_file):
for every job whose result is metrics.json (bertkit.jobs.JOBS), a run with a cut split and a
run whose limit cuts nothing, each read back from every writer (WRITERS: metrics.json, the
model card, the W&B run, the printout); and the jobs made of finetunes (two-stage, pretraining's
downstream finetunes) carry their finetunes' cuts."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import pytest
from huggingface_hub import ModelCard

from bertkit.data.metrics_file import LIMITED_SAMPLES, METRICS_FILE, describe_cut
from bertkit.jobs import JOBS, run_job
from bertkit.training.wandb_logging import PARTIAL_DATA_TAG, PARTIAL_GROUP_SUFFIX
from tests.conftest import compose_config, tiny_run_overrides
from tests.glue_fixtures import WORDS, write_glue_task
from tests.wandb_records import read_offline_run

DEV, CUT = 12, 3  # the dev split's examples, and the cut run's task.max_eval_samples


def _vocab(directory: Path) -> Path:
    directory.mkdir(parents=True)
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", '"', ".", "?", *sorted(WORDS)]
    (directory / "vocab.txt").write_text("\n".join(tokens) + "\n")
    return directory


def _finetune(root: Path, cut: bool) -> list[str]:
    """A tiny RTE finetune; cut: the first CUT dev examples, else a limit above the split's
    size (which cuts nothing)."""
    import random

    data = write_glue_task("rte", root / "rte", 24, DEV, 6, random.Random(0))
    return tiny_run_overrides("rte", data, _vocab(root / "vocab"), logger="wandb",
                              **{"logger.mode": "offline", "cache_dir": root / "cache",
                                 "trainer.max_steps": 1,
                                 "task.max_eval_samples": CUT if cut else 10 * DEV})


def _pretrain(root: Path, cut: bool) -> list[str]:
    """A tiny pretraining run; cut: the corpus read up to its first 8 documents, else a limit
    above the corpus's size (which cuts nothing)."""
    return ["recipe=pretrain", "corpus=demo", "model=scratch_tiny",
            "model.config.hidden_size=32", "model.config.intermediate_size=64",
            "model.config.max_position_embeddings=64", "tokenizer_training.enabled=true",
            "tokenizer_training.vocab_size=300", "pretraining.max_seq_length=32",
            "pretraining.long_phase.fraction=0", "trainer.max_steps=1",
            "trainer.per_device_train_batch_size=4", "trainer.save_strategy=no",
            "heldout.every_seconds=null", "heldout.every_steps=1", "heldout.batch_size=4",
            f"corpus.max_documents={8 if cut else 100000}", "trainer.disable_tqdm=true",
            f"cache_dir={root / 'cache'}", "logger=wandb", "logger.mode=offline"]


# Every job whose result is a score (metrics.json, bertkit.jobs.JOBS) -> a tiny run of it,
# cut or not: a job added there without one here fails the fixture.
SCORING = sorted(name for name, job in JOBS.items() if job.result_file == METRICS_FILE)
TINY_RUNS = {"finetune": _finetune, "pretrain": _pretrain}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[tuple[str, bool], dict]:
    """(job, cut) -> its run directory, record and printout."""
    saved = {key: os.environ.get(key) for key in ("WANDB_MODE", "WANDB_SILENT", "BERTKIT_CACHE")}
    os.environ.pop("WANDB_MODE", None)
    os.environ["WANDB_SILENT"] = "true"
    done = {}
    try:
        for job in SCORING:
            overrides = TINY_RUNS[job]  # a scoring job without a tiny run here fails here
            for cut in (True, False):
                root = tmp_path_factory.mktemp(f"{job}-{'cut' if cut else 'full'}")
                os.environ["BERTKIT_CACHE"] = str(root / "cache")
                printed = io.StringIO()
                with contextlib.redirect_stdout(printed):
                    record = run_job(compose_config(overrides(root, cut)), root / "run")
                done[job, cut] = {"dir": root / "run", "record": record,
                                  "printout": printed.getvalue()}
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return done


def _metrics_file(run: dict) -> bool:
    return bool(json.loads((run["dir"] / METRICS_FILE).read_text())["details"]
                .get(LIMITED_SAMPLES))


def _model_card(run: dict) -> bool:
    """Partial: the card says so, and gives no model-index result for a cut split; a full
    run's card gives its scores there."""
    card = ModelCard.load(run["dir"] / "model" / "README.md")
    cut = run["record"]["details"].get(LIMITED_SAMPLES, {})
    indexed = {result.dataset_split for result in card.data.eval_results or []}
    says = "Partial data: not a result on" in card.text
    assert says == bool(cut)
    assert all(describe_cut(part, entry) in card.text for part, entry in cut.items())
    assert not indexed & set(cut)
    assert bool(indexed) != bool(cut)  # scored splits are results only in a full run
    return says


def _wandb(run: dict) -> bool:
    (offline,) = (run["dir"] / "wandb").glob("offline-run-*")
    logged = read_offline_run(offline)
    tagged = PARTIAL_DATA_TAG in logged["tags"]
    assert tagged == logged["group"].endswith(PARTIAL_GROUP_SUFFIX)
    assert tagged == (LIMITED_SAMPLES in logged["summary"])
    return tagged


def _printout(run: dict) -> bool:
    cut = run["record"]["details"].get(LIMITED_SAMPLES, {})
    says = "part of the data only, no result on" in run["printout"]
    assert all(describe_cut(part, entry) in run["printout"] for part, entry in cut.items())
    return says


# Every writer of a job's score (bertkit.training.run.publish, and the W&B run train_run opens)
# -> whether what it wrote marks the run as one on part of the data.
WRITERS = {"metrics.json": _metrics_file, "model card": _model_card, "W&B": _wandb,
           "printout": _printout}


@pytest.mark.slow
@pytest.mark.parametrize("writer", sorted(WRITERS))
@pytest.mark.parametrize("job", SCORING)
def test_every_writer_marks_the_cut_run_and_not_the_full_one(runs, job, writer):
    assert WRITERS[writer](runs[job, True]) is True
    assert WRITERS[writer](runs[job, False]) is False


@pytest.mark.slow
def test_what_was_cut_is_recorded_with_its_size(runs):
    assert runs["finetune", True]["record"]["details"][LIMITED_SAMPLES] == {
        "validation": {"examples": CUT, "of": DEV}}
    assert runs["pretrain", True]["record"]["details"][LIMITED_SAMPLES] == {
        "corpus": {"examples": 8, "of": None}}


def test_two_stage_targets_carry_the_first_stages_cuts(monkeypatch, tmp_path):
    """finetuning=stilts under debug=smoke: the target's score stands on the first stage's
    cut data, and its record says so under intermediate/<split>."""
    from bertkit.jobs import two_stage

    calls = []

    def finetune(cfg, family, run_dir, details=None):
        calls.append(details)
        return {"task": cfg.task.name, "main_metric": "accuracy", "main_value": 0.5,
                "train": {}, "details": {LIMITED_SAMPLES: {"train": {"examples": 16,
                                                                     "of": 24}}}}

    monkeypatch.setattr(two_stage, "finetune", finetune)
    monkeypatch.setattr(two_stage, "export_encoder", lambda *args: None)
    cfg = compose_config(["recipe=glue", "task=mrpc", "finetuning=stilts",
                          "finetuning.intermediate.task=rte", "debug=smoke"])
    two_stage.finetune_two_stage(cfg, tmp_path)
    assert calls[1][LIMITED_SAMPLES] == {"intermediate/train": {"examples": 16, "of": 24}}


@pytest.mark.slow  # a pretraining run
def test_downstream_finetunes_carry_their_cuts_into_the_pretraining_record(monkeypatch,
                                                                          tmp_path):
    from bertkit.pretraining import run as downstream

    cuts = {"validation": {"examples": 16, "of": 277}}

    def finetune(cfg, family, run_dir, details=None):
        return {"main_metric": "accuracy", "main_value": 0.5, "validation": {},
                "details": {LIMITED_SAMPLES: cuts} if cfg.task.name == "rte" else {}}

    monkeypatch.setattr(downstream, "finetune", finetune)
    cfg = compose_config(["experiment=pretrain_small", "downstream.tasks={rte: [], mrpc: []}"])
    results = downstream.finetune_downstream(cfg,
                                             tmp_path / "model", tmp_path)
    assert results["rte"][LIMITED_SAMPLES] == cuts
    assert LIMITED_SAMPLES not in results["mrpc"]


def test_a_pretraining_card_marks_a_cut_downstream_finetune(tmp_path):
    """The card's downstream table: a finetune on part of its data says so, a full one not."""
    from bertkit.training.model_card import run_card

    cfg = compose_config(["experiment=pretrain_small"])
    cuts = {"validation": {"examples": 16, "of": 277}}
    record = {"family": "pretraining", "objective": "mlm_nsp", "masking": "static",
              "seed": 1, "heldout": None, "train": {}, "hyperparameters": {},
              "downstream": {"rte": {"main_metric": "accuracy", "main_value": 0.5,
                                     LIMITED_SAMPLES: cuts},
                             "mrpc": {"main_metric": "accuracy", "main_value": 0.6}}}
    text = str(run_card(cfg, record))
    rows = {line.split("|")[1].strip(): line for line in text.splitlines()
            if line.startswith(("| rte", "| mrpc"))}
    assert describe_cut("validation", cuts["validation"]) in rows["rte"]
    assert "partial data" in rows["rte"] and "partial data" not in rows["mrpc"]


@pytest.mark.parametrize("max_documents", [None, 16, 100])
def test_pretraining_cuts_name_a_corpus_read_up_to_its_limit(max_documents):
    """corpus.max_documents counts where reading stopped there (16 documents read, held-out
    ones included, of a larger corpus; the whole is not counted); a limit above the corpus
    (100) cut nothing. The held-out sample's size (heldout.max_sequences) is no cut: only the
    corpus node decides."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from bertkit.pretraining.run import pretraining_cuts

    heldout = SimpleNamespace(mlm=[0, 1], pairs=None, documents=3)
    data = SimpleNamespace(train_documents=13, heldout=heldout)
    cuts = pretraining_cuts(OmegaConf.create({"max_documents": max_documents}), data)
    expected = {"corpus": {"examples": 16, "of": None}} if max_documents == 16 else {}
    assert cuts == expected
