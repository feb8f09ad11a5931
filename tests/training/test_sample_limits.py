"""task.max_train_samples / max_eval_samples / max_predict_samples, for every task family of
the registry (bertkit.tasks.FAMILIES): the first N examples of each split reach tokenisation
and no others, as run_glue.py's dataset.select(range(N)); a limited run's cache entries are
its own, never the full run's; metrics.json says which splits were cut."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import datasets
import pytest

from bertkit.data.task_data import TaskSplits, first_examples
from bertkit.errors import BertkitError
from bertkit.jobs import run_job
from bertkit.tasks import FAMILIES, task_family
from tests.conftest import compose_config, tiny_checkpointed_training
from tests.glue_fixtures import WORDS, write_glue_task
from tests.ner_fixtures import conll_text, make_sentences
from tests.ner_fixtures import write_vocab as write_ner_vocab
from tests.swag_fixtures import make_rows, write_swag_csv
from tests.swag_fixtures import write_vocab as write_swag_vocab
from tests.tasks.squad.test_squad_features import SETTINGS, make_examples
from tests.tasks.squad.test_squad_features import write_vocab as write_squad_vocab
from tests.tasks.squad.test_squad_recipe import write_squad_json

LIMITS = {"train": 5, "validation": 3, "test": 2}  # below every split's size below
KEYS = {"train": "task.max_train_samples", "validation": "task.max_eval_samples",
        "test": "task.max_predict_samples"}


def _glue(tmp_path: Path) -> tuple[list[str], dict[str, int]]:
    """MNLI: two dev splits and two unlabelled test splits (the leaderboard's)."""
    data = write_glue_task("mnli", tmp_path / "mnli", 12, 8, 6, random.Random(0))
    vocab = tmp_path / "vocab"
    vocab.mkdir()
    (vocab / "vocab.txt").write_text("\n".join(
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", '"', ".", "?", *sorted(WORDS)]) + "\n")
    overrides = {"recipe": "glue", "task": "mnli", "task.data_dir": data,
                 **tiny_checkpointed_training(vocab, tmp_path / "cache")}
    sizes = {"train": 12, "validation_matched": 8, "validation_mismatched": 8,
             "test_matched": 6, "test_mismatched": 6}
    return [f"{k}={v}" for k, v in overrides.items()], sizes


def _squad(tmp_path: Path) -> tuple[list[str], dict[str, int]]:
    """Examples are questions, counted before windows are cut."""
    train, dev = tmp_path / "train.json", tmp_path / "dev.json"
    write_squad_json(train, make_examples(12, seed=1), "v1.1")
    write_squad_json(dev, make_examples(8, seed=2), "v1.1")
    overrides = {"recipe": "squad", "task.train_file": train, "task.validation_file": dev,
                 **{f"task.{key}": value for key, value in SETTINGS.items()},
                 **tiny_checkpointed_training(write_squad_vocab(tmp_path / "vocab"),
                                              tmp_path / "cache")}
    return [f"{k}={v}" for k, v in overrides.items()], {"train": 12, "validation": 8}


def _swag(tmp_path: Path) -> tuple[list[str], dict[str, int]]:
    train = write_swag_csv(tmp_path / "train.csv", make_rows(12, seed=1))
    dev = write_swag_csv(tmp_path / "val.csv", make_rows(8, seed=2))
    overrides = {"recipe": "swag", "task.train_file": train, "task.validation_file": dev,
                 "task.max_seq_length": 32,
                 **tiny_checkpointed_training(write_swag_vocab(tmp_path / "vocab"),
                                              tmp_path / "cache")}
    return [f"{k}={v}" for k, v in overrides.items()], {"train": 12, "validation": 8}


def _ner(tmp_path: Path) -> tuple[list[str], dict[str, int]]:
    """Examples are sentences; CoNLL-2003's test split is labelled."""
    files = {}
    for split, n, seed in (("train", 12, 1), ("validation", 8, 2), ("test", 6, 3)):
        files[split] = tmp_path / "conll" / f"{split}.txt"
        files[split].parent.mkdir(exist_ok=True)
        files[split].write_text(conll_text(make_sentences(n, seed)))
    overrides = {"recipe": "ner", "task.train_file": files["train"],
                 "task.validation_file": files["validation"], "task.test_file": files["test"],
                 "model.do_lower_case": False,
                 **tiny_checkpointed_training(write_ner_vocab(tmp_path / "vocab"),
                                              tmp_path / "cache")}
    return [f"{k}={v}" for k, v in overrides.items()], {"train": 12, "validation": 8, "test": 6}


# family -> tiny local data: (the run's overrides, the size of each split it reads)
TINY_DATA: dict[str, Callable[[Path], tuple[list[str], dict[str, int]]]] = {
    "glue": _glue, "squad": _squad, "swag": _swag, "ner": _ner}


class _Tokenised(Exception):
    """Stops a run once its data is featurised: the test needs nothing after that."""


def _tokenise(monkeypatch, family_name: str, overrides: list[str], tmp_path: Path,
              name: str) -> tuple[dict[str, int], set[Path]]:
    """Runs the job up to its features; returns the examples of each split that entered the
    family's tokenisation (featurize), and the cache entries that appeared."""
    family = task_family(family_name)
    featurize = type(family).featurize
    seen: dict[str, int] = {}

    def recording(self, cfg, splits, tokenizer):
        seen.update({split: len(table) for split, table in splits.items()})
        featurize(self, cfg, splits, tokenizer)
        raise _Tokenised

    monkeypatch.setattr(type(family), "featurize", recording)
    cache = tmp_path / "cache" / family_name
    before = set(cache.glob("*")) if cache.is_dir() else set()
    with pytest.raises(_Tokenised):
        run_job(compose_config(overrides), tmp_path / name)
    return seen, set(cache.glob("*")) - before


def test_every_family_has_tiny_data_here():
    assert set(TINY_DATA) == set(FAMILIES)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_only_the_first_examples_are_tokenised_into_an_entry_of_their_own(
        family, tmp_path, monkeypatch):
    if family not in TINY_DATA:
        pytest.fail(f"family {family}: add its tiny data to TINY_DATA")
    overrides, sizes = TINY_DATA[family](tmp_path)
    full, full_entries = _tokenise(monkeypatch, family, overrides, tmp_path, "full")
    assert full == sizes
    limits = [f"{KEYS[role]}={n}" for role, n in LIMITS.items()]
    limited, limited_entries = _tokenise(monkeypatch, family, overrides + limits, tmp_path,
                                         "limited")
    assert limited == {split: LIMITS[split.split("_")[0]] for split in sizes}
    assert full_entries and limited_entries
    assert not limited_entries & full_entries
    # Again, limited: its own entries are read back, and the full run's are left as they were.
    again, new_entries = _tokenise(monkeypatch, family, overrides + limits, tmp_path, "again")
    assert again == limited and not new_entries


def test_the_first_examples_in_their_order_and_metrics_json_says_so(tmp_path):
    """A whole tiny GLUE run: the dev predictions are of the first examples, and metrics.json
    names each cut split with its size."""
    overrides, sizes = _glue(tmp_path)
    record = run_job(compose_config(overrides + [
        "task.max_train_samples=5", "task.max_eval_samples=3", "trainer.max_steps=1",
        "trainer.eval_strategy=no", "trainer.save_strategy=no"]), tmp_path / "run")
    assert record["details"]["limited_samples"] == {
        "train": {"examples": 5, "of": 12},
        "validation_matched": {"examples": 3, "of": 8},
        "validation_mismatched": {"examples": 3, "of": 8}}
    dev = (tmp_path / "mnli" / "dev_matched.tsv").read_text().splitlines()[1:4]
    predicted = (tmp_path / "run" / "predictions" / "validation_matched.tsv").read_text()
    assert len(predicted.splitlines()) == 1 + 3
    assert [line.split("\t")[0] for line in predicted.splitlines()[1:]] == \
        [line.split("\t")[0] for line in dev]
    assert len((tmp_path / "run" / "leaderboard" / "MNLI-m.tsv").read_text().splitlines()) \
        == 1 + sizes["test_matched"]


def test_a_limit_that_cuts_nothing_is_the_full_data():
    table = datasets.Dataset.from_dict({"text": ["a", "b", "c"]})
    splits = TaskSplits({"train": table, "validation": table}, {"train": "f1", "validation": "f2"})
    same = first_examples(splits, {"max_train_samples": 3, "max_eval_samples": None})
    assert same.fingerprint() == splits.fingerprint() and not same.limited
    cut = first_examples(splits, {"max_train_samples": 2})
    assert cut["train"]["text"] == ["a", "b"] and cut["validation"]["text"] == ["a", "b", "c"]
    assert cut.fingerprints["train"] != "f1" and cut.fingerprints["validation"] == "f2"
    assert first_examples(splits, {"max_train_samples": 1}).fingerprints["train"] \
        != cut.fingerprints["train"]


@pytest.mark.parametrize("value", [0, -1, "abc"])
def test_a_limit_out_of_range_is_refused_naming_the_key(value, tmp_path):
    with pytest.raises(BertkitError, match=rf"task.max_eval_samples={value!r}"):
        run_job(compose_config(["logger=none", f"task.max_eval_samples={value}"]),
                tmp_path / "run")
