"""task.max_train_samples / max_eval_samples / max_predict_samples, for every task family of
the registry (bertkit.tasks.FAMILIES): the first N examples of each split reach tokenisation
and no others, as run_glue.py's dataset.select(range(N)); a limited run's cache entries are
its own, never the full run's; metrics.json says which splits were cut."""

from __future__ import annotations

from pathlib import Path

import datasets
import pytest

from bertkit.data.task_data import TaskSplits, first_examples
from bertkit.errors import BertkitError
from bertkit.jobs import run_job
from bertkit.tasks import FAMILIES, task_family
from tests.conftest import compose_config, tiny_checkpointed_training
from tests.family_fixtures import tiny_family_run

LIMITS = {"train": 5, "validation": 3, "test": 2}  # below every split's size (SIZES)
SIZES = (12, 8, 6)
KEYS = {"train": "task.max_train_samples", "validation": "task.max_eval_samples",
        "test": "task.max_predict_samples"}


def _tiny_run(family: str, tmp_path: Path) -> tuple[list[str], dict[str, int]]:
    """A run of a few steps, evaluated and checkpointed (tests.conftest; the family's data
    has its vocabulary in tmp_path/vocab)."""
    return tiny_family_run(family, tmp_path, SIZES,
                           **tiny_checkpointed_training(tmp_path / "vocab", tmp_path / "cache"))


class _Tokenised(Exception):
    """Stops a run once its data is featurised: the test needs nothing after that."""


def _tokenise(monkeypatch, family_name: str, overrides: list[str], tmp_path: Path,
              name: str) -> tuple[dict[str, int], set[Path]]:
    """Runs the job up to its features; returns the examples of each split that entered the
    family's tokenisation (featurize), and the cache entries that appeared."""
    family = task_family(family_name)
    featurize = type(family).featurize
    seen: dict[str, int] = {}

    def recording(self, task, splits, tokenizer, cache_dir, num_proc):
        seen.update({split: len(table) for split, table in splits.items()})
        featurize(self, task, splits, tokenizer, cache_dir, num_proc)
        raise _Tokenised

    monkeypatch.setattr(type(family), "featurize", recording)
    cache = tmp_path / "cache" / family_name
    before = set(cache.glob("*")) if cache.is_dir() else set()
    with pytest.raises(_Tokenised):
        run_job(compose_config(overrides), tmp_path / name)
    return seen, set(cache.glob("*")) - before


@pytest.mark.slow  # three jobs per family, up to their features
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_only_the_first_examples_are_tokenised_into_an_entry_of_their_own(
        family, tmp_path, monkeypatch):
    overrides, sizes = _tiny_run(family, tmp_path)
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


@pytest.mark.slow  # a run
def test_the_first_examples_in_their_order_and_metrics_json_says_so(tmp_path, capsys):
    """A whole tiny GLUE run: the dev predictions are of the first examples, and metrics.json
    and the printout name each cut split with its size."""
    overrides, sizes = _tiny_run("glue", tmp_path)
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
    assert ("part of the data only, no result on mnli: "
            "train: the first 5 of 12 examples (task.max_train_samples); "
            "validation_matched: the first 3 of 8 examples (task.max_eval_samples); "
            "validation_mismatched: the first 3 of 8 examples (task.max_eval_samples)"
            ) in capsys.readouterr().out


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
