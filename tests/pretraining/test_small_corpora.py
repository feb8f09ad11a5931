"""Corpora of 1, 2 and 3 documents under every objective of conf/objective/, with the held-out
defaults: a run trains, on the documents its objective needs, holding out what is left; or it
fails in one line naming the setting that works, and with that setting it trains."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from bertkit.config_tree import config_dir
from bertkit.errors import BertkitError
from bertkit.pretraining.heldout import document_keys
from bertkit.pretraining.objective import documents_dataset
from bertkit.pretraining.run import pretrain, split_corpus
from tests.conftest import compose_config
from tests.pretraining.test_heldout import generated_documents, texts, write_corpus
from tests.pretraining.test_heldout import vocab as vocab  # noqa: F401 (the fixture)
from tests.pretraining.test_pretrain_recipe import small_run

OBJECTIVES = sorted(path.stem for path in (Path(config_dir()) / "objective").glob("*.yaml"))
STEPS = 2
# The advice at the end of the message: `<key=value ...> trains on ...`.
ADVICE = re.compile(r": ((?:[\w.]+=\S+ )+)trains on")


def overrides(corpus: Path, vocab: Path, cache: Path, **extra) -> list[str]:
    """A 2-step run of a 32-wide BERT; heldout.* left at the recipe's defaults."""
    return small_run(**{"corpus": "files", "corpus.files": f"[{corpus}]",
                        "model.tokenizer": str(vocab), "masking": "dynamic",
                        "trainer.max_steps": STEPS,
                        "pretraining.max_seq_length": 64, "cache_dir": str(cache), **extra})


@pytest.mark.slow  # a pretraining run (two where refused) per objective and corpus size
@pytest.mark.parametrize("documents", [1, 2, 3])
@pytest.mark.parametrize("objective", OBJECTIVES)
def test_a_small_corpus_trains_or_names_the_setting_that_works(tmp_path, vocab, objective,
                                                               documents):
    corpus = tmp_path / "corpus.txt"
    write_corpus(corpus, generated_documents(documents))
    cfg = compose_config(overrides(corpus, vocab, tmp_path / "cache", objective=objective))
    assert cfg.heldout.fraction == 0.05 and cfg.heldout.min_documents == 2  # the defaults
    # NSP draws NotNext segments from another document: 2 on each side of the split.
    needed = 2 if cfg.objective.sentence_task == "nsp" else 1
    if documents >= 2 * needed:
        summary = pretrain(cfg, tmp_path / "run")
        assert summary["train"]["steps"] == STEPS
        heldout = summary["heldout"]
        assert heldout["train_documents"] >= needed and heldout["documents"] >= 1
        assert heldout["train_documents"] + heldout["documents"] == documents
        train, held = split_corpus(cfg)  # the held-out set is the rest of the corpus
        everything = texts({"sentences": d} for d in generated_documents(documents))
        assert texts(held) == everything - texts(train) and len(held) == heldout["documents"]
        return
    with pytest.raises(BertkitError) as raised:
        pretrain(cfg, tmp_path / "run")
    message = str(raised.value)
    assert "\n" not in message and "min_documents" not in message
    advice = ADVICE.search(message)
    assert advice, message
    settings = advice.group(1).split()
    assert "heldout.fraction=0" in settings
    assert ("objective=sop" in settings) == (documents < needed)
    # The setting named works.
    extra = {"objective": objective, **dict(setting.split("=", 1) for setting in settings)}
    fixed = compose_config(overrides(corpus, vocab, tmp_path / "cache", **extra))
    summary = pretrain(fixed, tmp_path / "fixed")
    assert summary["train"]["steps"] == STEPS and summary["heldout"] is None


def test_a_fraction_that_leaves_nsp_one_training_document_is_named(tmp_path, vocab):
    """The largest key as the fraction holds out all but one document: MLM trains on that
    one, NSP is told to lower heldout.fraction (not NSP's own error, deep in the data)."""
    corpus = tmp_path / "corpus.txt"
    documents = generated_documents(6)
    write_corpus(corpus, documents)
    fraction = float(np.max(document_keys(documents_dataset(documents))))
    settings = {"heldout.fraction": fraction}
    train, held = split_corpus(compose_config(overrides(
        corpus, vocab, tmp_path / "cache", objective="mlm", **settings)))
    assert (len(train), len(held)) == (1, 5)
    cfg = compose_config(overrides(corpus, vocab, tmp_path / "cache", objective="mlm_nsp",
                                   **settings))
    with pytest.raises(BertkitError, match=rf"^heldout.fraction={fraction} holds out 5 of the "
                                           r"corpus's 6 documents, leaving training 1; "
                                           r"objective=mlm_nsp needs 2: lower heldout.fraction$"):
        split_corpus(cfg)
