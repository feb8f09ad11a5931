"""Every kind of file bertkit reads back, cut as a crash or a full disk cuts it: a cache is
rebuilt on the next run, to the same content; a result is refused, one line naming it.

The files are the ones real runs wrote (a GLUE finetune, an NER finetune, a pretraining run,
a sweep of GLUE finetunes for the report). KINDS is the one list of kinds: a new kind of file
read back is one entry, and is cut and read again like the others.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pyarrow as pa
import pytest

import bertkit.pretraining.run as pretraining_module
from bertkit.data.atomic_files import (
    END_OF_STREAM,
    DamagedFile,
    check_arrow,
    check_saved_dataset,
    read_json,
    read_text,
    read_yaml,
    write_json_atomic,
)
from bertkit.jobs import run_job
from bertkit.pretraining.run import pretrain
from bertkit.pretraining.wordpiece import check_trained_tokenizer
from bertkit.reporting.cli import main as report_main
from bertkit.reporting.wandb_log import raw_records
from bertkit.sweeps.halving import HalvingLedger, read_outcome
from bertkit.tasks.ner.feature_based_tagger import load_feature_based_tagger
from tests.conftest import compose_config, tiny_checkpointed_training, tiny_run_overrides
from tests.glue_fixtures import WORDS, write_glue_task
from tests.ner_fixtures import conll_text, make_sentences, write_vocab
from tests.pretraining.test_pretrain_recipe import tiny_pretraining_overrides

# -- the real runs -------------------------------------------------------------------------


def _vocab(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", '"', ".", "?"] + sorted(WORDS)
    (directory / "vocab.txt").write_text("\n".join(tokens) + "\n")
    return directory


@dataclass
class Run:
    """A real run's files and how to read them back as bertkit does (`again`: a rerun of the
    job for a cache, the report for results), with the first read's outcome to compare."""

    root: Path
    again: Callable[..., object]
    first: object = None
    files: dict | None = None  # where the run's data lives (pretraining: its datasets)
    # How a refused file shows in `again`'s outcome (the report's, unless told)
    refusal: Callable[[Run, Path, object], None] = None


def glue_run(root: Path) -> Run:
    data = write_glue_task("mrpc", root / "glue", 24, 12, 6, random.Random(0))
    cfg = compose_config(tiny_run_overrides("mrpc", data, _vocab(root / "vocab"),
                                            cache_dir=str(root / "cache")))
    return finetune_run(root, cfg)


def finetune_run(root: Path, cfg) -> Run:
    """A Run whose `again` trains cfg anew in a fresh run directory: (validation, train loss)."""
    runs = iter(range(100))

    def again(kind=None):
        run_dir = root / f"run{next(runs)}"
        summary = run_job(cfg, run_dir=run_dir)
        return summary["validation"], read_json(run_dir / "metrics.json")["train"]["loss"]

    return Run(root, again, again())


def conll_files(root: Path, train_sentences: int) -> dict[str, Path]:
    """Generated CoNLL-2003 train/validation/test files under root/conll."""
    files = {}
    for split, n, seed in (("train", train_sentences, 1), ("validation", 8, 2), ("test", 8, 3)):
        path = root / "conll" / f"{split}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(conll_text(make_sentences(n, seed)))
        files[split] = path
    return files


def ner_run(root: Path) -> Run:
    files = conll_files(root, 32)
    overrides = {"recipe": "ner", "task.train_file": files["train"],
                 "task.validation_file": files["validation"], "task.test_file": files["test"],
                 **tiny_checkpointed_training(write_vocab(root / "vocab"), root / "cache"),
                 "model.do_lower_case": False, "trainer.max_steps": 2,
                 "trainer.eval_strategy": "no", "trainer.save_strategy": "no"}
    return finetune_run(root, compose_config([f"{key}={value}"
                                              for key, value in overrides.items()]))


def ner_feature_based_run(root: Path) -> Run:
    """A feature-based NER run, whose saved tagger is read back by load_feature_based_tagger."""
    files = conll_files(root, 16)
    overrides = {"recipe": "ner", "experiment": "ner_feature_based",
                 "task.train_file": files["train"], "task.validation_file": files["validation"],
                 "task.test_file": files["test"],
                 **tiny_checkpointed_training(write_vocab(root / "vocab"), root / "cache"),
                 "model.do_lower_case": False, "model.config.num_hidden_layers": 4,
                 "model.feature_based.lstm_hidden_size": 8, "trainer.max_steps": 1,
                 "trainer.eval_strategy": "no", "trainer.save_strategy": "no",
                 "trainer.load_best_model_at_end": False}
    run_job(compose_config([f"{key}={value}" for key, value in overrides.items()]),
            root / "run")

    def again(kind=None):
        try:
            load_feature_based_tagger(root / "run" / "model")
        except DamagedFile as err:
            return str(err)
        return None

    def refusal(run: Run, path: Path, outcome) -> None:
        assert outcome.startswith(f"{path}: not valid JSON") and "\n" not in outcome

    return Run(root, again, again(), refusal=refusal)


def pretraining_run(root: Path) -> Run:
    cfg = compose_config(tiny_pretraining_overrides(**{
        "cache_dir": str(root / "cache"), "corpus.files": f"[{root / 'demo.txt'}]",
        "model.config.hidden_size": 32, "model.config.intermediate_size": 64,
        "tokenizer_training.vocab_size": 200, "trainer.max_steps": 2,
        "trainer.per_device_train_batch_size": 8, "trainer.logging_steps": 1,
        "heldout.max_sequences": 16, "heldout.every_steps": 2, "heldout.every_seconds": "null"}))
    run = Run(root, lambda: None, files={})
    runs = iter(range(100))
    prepare = pretraining_module.prepare_pretraining_data

    def recording(*args, **kwargs):
        data = prepare(*args, **kwargs)
        run.files.update(data=data)
        return data

    def again(kind=None):
        with mock.patch.object(pretraining_module, "prepare_pretraining_data", recording):
            record = pretrain(cfg, root / f"run{next(runs)}")
        heldout = record["heldout"]
        return (heldout["fingerprint"], heldout["pairs"]["fingerprint"],
                heldout["final"]["mlm_loss"], record["first_log"]["loss"],
                record["data"]["instances"])

    run.again = again
    run.first = again()
    return run


def sweep_of_runs(root: Path) -> Run:
    """Three GLUE finetunes (seeds 1-3) under one sweep directory, as a Hydra multirun leaves,
    each with its offline W&B run; the report reads them from kind.source."""
    data = write_glue_task("mrpc", root / "glue", 24, 12, 6, random.Random(0))
    vocab = _vocab(root / "vocab")
    for seed in (1, 2, 3):
        cfg = compose_config(tiny_run_overrides(
            "mrpc", data, vocab, seed=seed, cache_dir=str(root / "cache"), logger="wandb",
            **{"logger.mode": "offline"}))
        run_job(cfg, run_dir=root / "sweep" / f"seed{seed}")
    _write_halving_ledger(root / "sweep")

    def again(kind=None):
        source = kind.source if kind is not None else "auto"
        assert report_main([str(root / "sweep"), "--out", str(root / "report"),
                            "--source", source]) == 0
        return read_text(root / "report" / "report.md"), read_json(root / "report" /
                                                                  "report.json")

    return Run(root, again, again())


def _write_halving_ledger(sweep: Path) -> None:
    """halving.json as the halving sweeper writes it, for one rung over the sweep's jobs."""
    outcomes = {(f"seed={seed}",): read_outcome(sweep / f"seed{seed}", read_json(
        sweep / f"seed{seed}" / "metrics.json")["main_value"]) for seed in (1, 2, 3)}
    jobs = {job: job for job in outcomes}
    ledger = HalvingLedger(fractions=[1.0], eta=2.0)
    ledger.record_rung(0, outcomes, jobs, {job: () for job in outcomes}, set(jobs))
    write_json_atomic(sweep / "halving.json", ledger.as_dict())


def halving_ledger_named(run: Run, path: Path, outcome) -> None:
    """The ledger is named in the report's halving section; every run is still tabled."""
    markdown, report = outcome
    assert f"`halving.json`: unreadable ledger: {path}: not valid JSON" in markdown
    assert report["n_runs"] == 3 and report["failed"] == []


RUNS = {"glue": glue_run, "ner": ner_run, "ner_feature_based": ner_feature_based_run,
        "pretraining": pretraining_run, "sweep": sweep_of_runs}


def cut(path: Path) -> bytes:
    """The file cut in the middle, as a full disk leaves it; returns what it held."""
    whole = path.read_bytes()
    path.write_bytes(whole[:len(whole) // 2])
    return whole


def corrupt(path: Path) -> bytes:
    """64 bytes in the middle overwritten (a bad sector, a bad copy); returns what it held."""
    whole = path.read_bytes()
    middle = len(whole) // 2
    path.write_bytes(whole[:middle] + b"\xab" * 64 + whole[middle + 64:])
    return whole


# -- the kinds -----------------------------------------------------------------------------


def _one(paths) -> Path:
    (path,) = sorted(paths)
    return Path(path)


def _static_masks(run: Run) -> Path:
    return Path(run.files["data"].train_dataset.cache_files[0]["filename"])


def _heldout(run: Run) -> Path:
    return Path(run.files["data"].heldout.mlm.cache_files[0]["filename"])


def _ner_train(run: Run) -> Path:
    """The NER training split's cached features (the largest of the three splits' entries)."""
    tables = (run.root / "cache" / "ner").glob("*/features/table/*.arrow")
    return max(tables, key=lambda path: path.stat().st_size).parent.parent


def _vocab_dir(run: Run) -> Path:
    return _one((run.root / "cache" / "wordpiece").iterdir())


@dataclass(frozen=True)
class Kind:
    name: str
    run: str  # which real run writes it (RUNS)
    file: Callable[[Run], Path]
    check: Callable[[Path], object]  # the verifying reader of its format
    rebuilt: bool  # a cache: rebuilt by the next run; else a result: refused, named
    # What a rebuild must reproduce. The tokenizers library's WordPiece training numbers the
    # same vocabulary in a different order from one training to the next, so a retrained
    # vocabulary is compared as a set of tokens and the run's results are not compared.
    content: Callable[[bytes], object] = bytes
    same_results: bool = True
    damage: Callable[[Path], bytes] = cut  # or corrupt
    source: str = "auto"  # where the report reads a result kind from (--source)
    refusal: Callable[[Run, Path, object], None] | None = None  # else the run's


def _trained_vocabulary(path: Path) -> None:
    check_trained_tokenizer(path.parent)


def _tokens(text: bytes) -> set[str]:
    return set(text.decode().split("\n"))


def _model_tokens(text: bytes) -> set[str]:
    return set(json.loads(text)["model"]["vocab"])


KINDS = [
    Kind("GLUE tokenisation cache entry", "glue",
         lambda run: _one((run.root / "cache" / "glue").glob("*/train.arrow")), check_arrow,
         True),
    Kind("NER feature table", "ner",
         lambda run: _one((_ner_train(run) / "table").glob("*.arrow")), check_arrow, True),
    Kind("NER feature facts", "ner", lambda run: _ner_train(run) / "facts.json", read_json,
         True),
    Kind("NER saved table state", "ner", lambda run: _ner_train(run) / "table" / "state.json",
         lambda path: check_saved_dataset(path.parent), True),
    Kind("pretraining corpus", "pretraining",
         lambda run: _one((run.root / "cache" / "corpus").rglob("generator-train.arrow")),
         check_arrow, True),
    Kind("static-mask copies", "pretraining", _static_masks, check_arrow, True),
    Kind("held-out set", "pretraining", _heldout, check_arrow, True),
    Kind("trained vocabulary tokenizer.json", "pretraining",
         lambda run: _vocab_dir(run) / "tokenizer.json", _trained_vocabulary, True, _model_tokens,
         False),
    Kind("trained vocabulary vocab.txt", "pretraining",
         lambda run: _vocab_dir(run) / "vocab.txt", _trained_vocabulary, True, _tokens, False),
    Kind("metrics.json in the report", "sweep",
         lambda run: run.root / "sweep" / "seed2" / "metrics.json", read_json, False),
    Kind("config.yaml in the report", "sweep",
         lambda run: run.root / "sweep" / "seed3" / "config.yaml", read_yaml, False),
    Kind("feature-based tagger settings", "ner_feature_based",
         lambda run: run.root / "run" / "model" / "feature_based_tagger.json", read_json, False),
    Kind("successive-halving ledger in the report", "sweep",
         lambda run: run.root / "sweep" / "halving.json", read_json, False,
         refusal=halving_ledger_named),
    Kind("W&B log in the report", "sweep",
         lambda run: _one((run.root / "sweep" / "seed1").glob("wandb/offline-run-*/*.wandb")),
         raw_records, False, damage=corrupt, source="wandb"),
]


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory):
    made: dict[str, Run] = {}

    def get(name: str) -> Run:
        if name not in made:
            made[name] = RUNS[name](tmp_path_factory.mktemp(name))
        return made[name]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS, ids=[kind.name for kind in KINDS])
def test_a_cut_file_is_rebuilt_or_refused_by_name(kind, real_runs):
    run = real_runs(kind.run)
    path = kind.file(run)
    kind.check(path)  # whole as the run wrote it
    whole = kind.damage(path)
    with pytest.raises(DamagedFile, match=f"^{re.escape(str(path))}: "):
        kind.check(path)
    try:
        outcome = run.again(kind)
    finally:
        if not kind.rebuilt:
            path.write_bytes(whole)
    if kind.rebuilt:
        if kind.same_results:
            assert outcome == run.first  # rebuilt, not read as data: the same results
        else:
            run.first = outcome  # what later kinds of this run compare with
        rebuilt = kind.file(run)
        kind.check(rebuilt)
        assert kind.content(rebuilt.read_bytes()) == kind.content(whole)
        return
    (kind.refusal or run.refusal or report_names_it)(run, path, outcome)


def report_names_it(run: Run, path: Path, outcome) -> None:
    """The report's failed jobs name the file, and its tables hold the two whole runs."""
    markdown, report = outcome
    (failed,) = report["failed"]
    run_dir = path.parent.relative_to(run.root / "sweep").as_posix()
    assert failed["run_dir"] == run_dir and str(path) in failed["error"]
    assert "\n" not in failed["error"]
    assert f"`{run_dir}`: unreadable " in markdown and f"{path}: " in markdown
    # The other runs are tabled: the two whole runs' scores, not the cut one's.
    assert report["n_runs"] == 2


# -- cuts that still parse -----------------------------------------------------------------


def _cuts_between(path: Path, ends: list[int]):
    """The file cut at each of the offsets, in turn; restored after."""
    whole = path.read_bytes()
    try:
        for end in ends:
            path.write_bytes(whole[:end])
            yield end
    finally:
        path.write_bytes(whole)


@pytest.mark.slow  # reads the module's GLUE run, built for the slow tests above
def test_an_arrow_file_cut_between_record_batches_is_refused(real_runs):
    """A stream cut after its schema or after any record batch parses, with fewer rows: only
    the missing end-of-stream marker tells it from a whole file."""
    path = _one((real_runs("glue").root / "cache" / "glue").glob("*/train.arrow"))
    with pa.memory_map(str(path)) as source:
        reader = pa.ipc.open_stream(source)
        ends, rows = [source.tell()], [0]  # after the schema: no row
        for batch in reader:
            ends.append(source.tell())
            rows.append(rows[-1] + batch.num_rows)
    assert len(ends) >= 2 and ends[-1] + len(END_OF_STREAM) == path.stat().st_size
    for cut_rows, _ in zip(rows, _cuts_between(path, ends), strict=True):
        with pa.memory_map(str(path)) as source:  # what datasets alone would read
            assert pa.ipc.open_stream(source).read_all().num_rows == cut_rows
        with pytest.raises(DamagedFile, match="without its end-of-stream marker"):
            check_arrow(path)


@pytest.mark.slow  # reads the module's sweep run, built for the slow tests above
def test_a_config_yaml_cut_at_a_line_end_is_refused(real_runs):
    """A run's config.yaml cut at any line end still parses as a (shorter) mapping; its
    missing end marker refuses it."""
    path = real_runs("sweep").root / "sweep" / "seed1" / "config.yaml"
    text = path.read_bytes()
    ends = [i + 1 for i, byte in enumerate(text) if byte == ord("\n")][:-1]
    for _ in _cuts_between(path, ends[:: max(1, len(ends) // 20)]):
        with pytest.raises(DamagedFile, match="cut YAML document"):
            read_yaml(path)
    assert read_yaml(path)["seed"] == 1
