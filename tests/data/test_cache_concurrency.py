"""Hydra's parallel launchers start sweep jobs together in separate processes, and jobs that
read the same data share one cache entry: two processes released at the same moment must
tokenise each item once, and both must read that one result."""

from __future__ import annotations

import functools
import logging
import multiprocessing
import os
import time
import traceback
from pathlib import Path

import datasets
import pytest

from bertkit.data.cache import cached_build, cached_map

ROWS = 300
BATCH = 100  # three batches of 0.2 s each: a race window far wider than a process start


def _table() -> datasets.Dataset:
    return datasets.Dataset.from_dict({"text": [f"sentence {i} of the race" for i in range(ROWS)]})


def _words() -> list[list[str]]:
    return [text.split() for text in _table()["text"]]


def _tokenise(batch: dict) -> dict:
    """Notes which job ran it (env, so that datasets' forked workers note it too), then dawdles."""
    with open(os.environ["RACE_CALLS"], "a") as calls:
        calls.write(os.environ["RACE_JOB"] + "\n")
    time.sleep(0.2)
    return {"words": [text.split() for text in batch["text"]]}


def _build(table: datasets.Dataset) -> tuple[datasets.Dataset, dict]:
    features = table.map(_tokenise, batched=True, batch_size=BATCH)
    return features, {"sentences": len(features), "words": sum(map(len, features["words"]))}


class _Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _race(job: int, barrier, queue, entry: Path, calls: Path, kind: str, num_proc: int) -> None:
    """One sweep job: waits for the other at the barrier, then fills the shared entry."""
    try:
        os.environ.update(RACE_JOB=str(job), RACE_CALLS=str(calls))
        handler = _Messages()
        logging.getLogger("bertkit").addHandler(handler)
        logging.getLogger("bertkit").setLevel(logging.INFO)
        datasets.disable_progress_bars()
        table = _table()
        barrier.wait()
        if kind == "map":
            result, facts = cached_map(table, _tokenise, entry, "train", num_proc=num_proc,
                                       batch_size=BATCH), None
        else:
            result, facts = cached_build(entry, "features", functools.partial(_build, table))
        queue.put((result.to_dict(), facts, handler.messages))
    except BaseException:
        queue.put(traceback.format_exc())


def _run_two_jobs(tmp_path: Path, kind: str, num_proc: int = 1) -> tuple[Path, list, list[str]]:
    """(the entry, each job's (rows, facts, log messages), the jobs that ran the work)."""
    context = multiprocessing.get_context("spawn")
    barrier, queue = context.Barrier(2), context.Queue()
    entry, calls = tmp_path / "entry", tmp_path / "calls.txt"
    entry.mkdir()
    jobs = [context.Process(target=_race,
                            args=(job, barrier, queue, entry, calls, kind, num_proc))
            for job in range(2)]
    for job in jobs:
        job.start()
    results = [queue.get(timeout=120) for _ in jobs]
    for job in jobs:
        job.join(timeout=30)
    for result in results:
        assert not isinstance(result, str), result
    return entry, results, calls.read_text().split()


def _items(entry: Path, name: str) -> list[str]:
    """What the entry holds besides the item's lock: the item, and any temporary leftovers."""
    return sorted(path.name for path in entry.iterdir() if path.name != f".{name}.lock")


def _kinds(messages: list[str], name: str, entry: Path) -> str:
    assert len(messages) == 1, messages
    assert messages[0] in (f"tokenised {name} into {entry}",
                           f"read {name} from the cache {entry}"), messages
    return messages[0].split()[0]


@pytest.mark.slow
@pytest.mark.parametrize("num_proc", [1, 2])
def test_cached_map_in_two_racing_jobs_tokenises_once(tmp_path, num_proc):
    entry, results, ran = _run_two_jobs(tmp_path, "map", num_proc)

    assert len(set(ran)) == 1, f"both jobs ran the map: {ran}"
    files = (["train.arrow"] if num_proc == 1
             else [f"train_{rank:05d}_of_00002.arrow" for rank in range(2)])
    assert _items(entry, "train") == files
    (rows, _, messages), (other_rows, _, other_messages) = results
    assert rows == other_rows
    assert rows["words"] == _words()
    assert sorted([_kinds(messages, "train", entry), _kinds(other_messages, "train", entry)]) \
        == ["read", "tokenised"]


@pytest.mark.slow
def test_cached_build_in_two_racing_jobs_builds_once(tmp_path):
    entry, results, ran = _run_two_jobs(tmp_path, "build")

    assert len(set(ran)) == 1, f"both jobs built the features: {ran}"
    assert _items(entry, "features") == ["features"]
    (rows, facts, messages), (other_rows, other_facts, other_messages) = results
    assert (rows, facts) == (other_rows, other_facts)
    assert rows["words"] == _words()
    assert facts == {"sentences": ROWS, "words": sum(map(len, _words()))}
    assert sorted([_kinds(messages, "features", entry),
                   _kinds(other_messages, "features", entry)]) == ["read", "tokenised"]


def test_cached_map_reads_its_file_back_unless_told_not_to(tmp_path, monkeypatch, caplog):
    calls = tmp_path / "calls.txt"
    monkeypatch.setenv("RACE_JOB", "0")
    monkeypatch.setenv("RACE_CALLS", str(calls))
    caplog.set_level(logging.INFO, logger="bertkit")

    def tokenised(**kwargs) -> list[list[str]]:
        return cached_map(_table(), _tokenise, tmp_path, "train", batch_size=BATCH,
                          **kwargs)["words"]

    assert tokenised() == tokenised() == tokenised(load_from_cache_file=False) == _words()
    assert len(calls.read_text().split()) == 2 * ROWS // BATCH  # the first and the third
    assert [record.getMessage() for record in caplog.records if record.name.startswith("bertkit")] \
        == [f"tokenised train into {tmp_path}", f"read train from the cache {tmp_path}",
            f"tokenised train into {tmp_path}"]
