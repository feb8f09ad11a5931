"""The SQuAD windows of a run (bertkit.tasks.squad.features.window_splits) on disk: one cache
entry per split, reused by a second job with the same data, tokenizer and window settings and
by no other, and preprocessing_num_workers carried from the config to the window building."""

from __future__ import annotations

import datasets
import pytest

from bertkit.data.cache import cache_entry
from bertkit.data.task_data import TaskSplits
from bertkit.errors import BertkitError
from bertkit.tasks.squad import features as squad_features
from bertkit.tasks.squad.family import FAMILY
from bertkit.tasks.squad.features import evaluation_features, train_features, window_splits
from tests.conftest import compose_config
from tests.tasks.squad.test_squad_features import SETTINGS, make_examples, make_tokenizer


@pytest.fixture
def splits() -> TaskSplits:
    return TaskSplits({"train": make_examples(6, seed=1), "validation": make_examples(4, seed=2)},
                      {"train": "train-data", "validation": "dev-data"})


@pytest.fixture
def tokenizer(tmp_path):
    return make_tokenizer(tmp_path / "vocab")


def entries(cache) -> set[str]:
    return {path.name for path in (cache / "squad").iterdir()}


def test_windows_are_cached_per_split_by_data_tokenizer_and_settings(splits, tokenizer,
                                                                     tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    train, evaluation = window_splits(splits, tokenizer, **SETTINGS, cache_dir=cache)
    assert train.to_list() == train_features(splits["train"], tokenizer, **SETTINGS).to_list()
    assert evaluation.to_list() == evaluation_features(splits["validation"], tokenizer,
                                                       **SETTINGS).to_list()
    train_entry, dev_entry = (cache_entry(cache, "squad", data=splits.fingerprint(split),
                                          tokenizer=tokenizer, settings=SETTINGS)
                              for split in ("train", "validation"))
    assert entries(cache) == {train_entry.name, dev_entry.name}
    assert train.cache_files[0]["filename"] == str(train_entry / "train_windows.arrow")
    assert evaluation.cache_files[0]["filename"] == str(dev_entry / "evaluation_windows.arrow")

    # A second job with the same key reads the cache: windowing again would fail here.
    def refuse(*args, **kwargs):
        raise AssertionError("cut windows again instead of reading the cache")

    with monkeypatch.context() as patch:
        patch.setattr(squad_features, "_windows", refuse)
        again = window_splits(splits, tokenizer, **SETTINGS, cache_dir=cache)
    assert again[0].to_list() == train.to_list()
    assert again[1].to_list() == evaluation.to_list()

    # Another doc_stride, another tokenizer, another dev file: new entries, new windows.
    wider = window_splits(splits, tokenizer, **{**SETTINGS, "doc_stride": 8}, cache_dir=cache)
    assert len(entries(cache)) == 4 and len(wider[0]) > len(train)
    (tmp_path / "other").mkdir()
    other = make_tokenizer(tmp_path / "other")
    other.add_tokens(["zzzz"])
    window_splits(splits, other, **SETTINGS, cache_dir=cache)
    assert len(entries(cache)) == 6
    new_dev = TaskSplits(splits.tables, {**splits.fingerprints, "validation": "edited"})
    window_splits(new_dev, tokenizer, **SETTINGS, cache_dir=cache)
    assert len(entries(cache)) == 7  # the training windows' entry is shared


def test_preprocessing_num_workers_reaches_the_window_building(splits, tokenizer, tmp_path,
                                                               monkeypatch):
    seen = []
    real_map = datasets.Dataset.map

    def recording_map(self, *args, num_proc=None, **kwargs):
        seen.append(num_proc)
        return real_map(self, *args, **kwargs)  # in process, whatever was asked

    monkeypatch.setattr(datasets.Dataset, "map", recording_map)
    cfg = compose_config(["recipe=squad", "preprocessing_num_workers=3",
                          f"cache_dir={tmp_path / 'cache'}",
                          *[f"task.{key}={value}" for key, value in SETTINGS.items()]])
    data = FAMILY.featurize(cfg.task, splits, tokenizer, cfg.cache_dir,
                            cfg.preprocessing_num_workers)
    assert seen == [3, 3]
    assert set(data.features) == {"train", "validation"}
    assert len(data.features["validation"]) > len(splits["validation"])


def test_a_tokenizer_without_offsets_is_refused(splits, tmp_path):
    from types import SimpleNamespace

    slow = SimpleNamespace(is_fast=False)  # a Python ("slow") tokenizer has no offset mapping
    with pytest.raises(BertkitError, match="fast tokenizer.*model.tokenizer"):
        window_splits(splits, slow, **SETTINGS, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()
