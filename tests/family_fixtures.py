"""Tiny local data of every task family (bertkit.tasks.FAMILIES), for tests that run a job of
each: the overrides of a run on it (recipe, data files, a tiny random-init BERT with a
vocabulary that covers the data, the cache) and the size of each split the run reads."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from tests.glue_fixtures import WORDS, write_glue_task
from tests.ner_fixtures import conll_text, make_sentences
from tests.ner_fixtures import write_vocab as write_ner_vocab
from tests.swag_fixtures import make_rows, write_swag_csv
from tests.swag_fixtures import write_vocab as write_swag_vocab
from tests.tasks.squad.test_squad_features import SETTINGS, make_examples
from tests.tasks.squad.test_squad_features import write_vocab as write_squad_vocab
from tests.tasks.squad.test_squad_recipe import write_squad_json

Sizes = tuple[int, int, int]  # examples of the training, each dev and each test split


def _tiny_model(vocab: Path, tmp_path: Path) -> dict:
    return {"model": "scratch_tiny", "model.tokenizer": vocab,
            "model.config.hidden_size": 32, "model.config.intermediate_size": 64,
            "cache_dir": tmp_path / "cache", "trainer.disable_tqdm": True}


def _glue(tmp_path: Path, sizes: Sizes) -> tuple[dict, dict[str, int]]:
    """MNLI: two dev splits and two unlabelled test splits (the leaderboard's)."""
    n_train, n_dev, n_test = sizes
    data = write_glue_task("mnli", tmp_path / "mnli", n_train, n_dev, n_test,
                           random.Random(0))
    vocab = tmp_path / "vocab"
    vocab.mkdir()
    (vocab / "vocab.txt").write_text("\n".join(
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", '"', ".", "?", *sorted(WORDS)]) + "\n")
    return ({"recipe": "glue", "task": "mnli", "task.data_dir": data,
             **_tiny_model(vocab, tmp_path)},
            {"train": n_train, "validation_matched": n_dev, "validation_mismatched": n_dev,
             "test_matched": n_test, "test_mismatched": n_test})


def _squad(tmp_path: Path, sizes: Sizes) -> tuple[dict, dict[str, int]]:
    """Examples are questions, counted before windows are cut; no test split."""
    train, dev = tmp_path / "train.json", tmp_path / "dev.json"
    write_squad_json(train, make_examples(sizes[0], seed=1), "v1.1")
    write_squad_json(dev, make_examples(sizes[1], seed=2), "v1.1")
    return ({"recipe": "squad", "task.train_file": train, "task.validation_file": dev,
             **{f"task.{key}": value for key, value in SETTINGS.items()},
             **_tiny_model(write_squad_vocab(tmp_path / "vocab"), tmp_path)},
            {"train": sizes[0], "validation": sizes[1]})


def _swag(tmp_path: Path, sizes: Sizes) -> tuple[dict, dict[str, int]]:
    """No test split."""
    train = write_swag_csv(tmp_path / "train.csv", make_rows(sizes[0], seed=1))
    dev = write_swag_csv(tmp_path / "val.csv", make_rows(sizes[1], seed=2))
    return ({"recipe": "swag", "task.train_file": train, "task.validation_file": dev,
             "task.max_seq_length": 32,
             **_tiny_model(write_swag_vocab(tmp_path / "vocab"), tmp_path)},
            {"train": sizes[0], "validation": sizes[1]})


def _ner(tmp_path: Path, sizes: Sizes) -> tuple[dict, dict[str, int]]:
    """Examples are sentences; CoNLL-2003's test split is labelled."""
    files = {}
    for split, n, seed in zip(("train", "validation", "test"), sizes, (1, 2, 3), strict=True):
        files[split] = tmp_path / "conll" / f"{split}.txt"
        files[split].parent.mkdir(exist_ok=True)
        files[split].write_text(conll_text(make_sentences(n, seed)))
    return ({"recipe": "ner", "task.train_file": files["train"],
             "task.validation_file": files["validation"], "task.test_file": files["test"],
             "model.do_lower_case": False,
             **_tiny_model(write_ner_vocab(tmp_path / "vocab"), tmp_path)},
            dict(zip(("train", "validation", "test"), sizes, strict=True)))


# family -> its tiny data: (the run's overrides, the size of each split it reads)
TINY_DATA: dict[str, Callable[[Path, Sizes], tuple[dict, dict[str, int]]]] = {
    "glue": _glue, "squad": _squad, "swag": _swag, "ner": _ner}


def tiny_family_run(family: str, tmp_path: Path, sizes: Sizes,
                    **extra) -> tuple[list[str], dict[str, int]]:
    """The overrides of a tiny run of `family` (with `extra` on top) and its splits' sizes."""
    if family not in TINY_DATA:
        raise AssertionError(f"family {family}: add its tiny data to tests/family_fixtures.py")
    overrides, split_sizes = TINY_DATA[family](tmp_path, sizes)
    return [f"{k}={v}" for k, v in {**overrides, **extra}.items()], split_sizes
