"""The bench_pretrain_data recipe: every stage is timed on work done (not a cache hit), the
counts equal the pipeline's own, and the real-token shares equal a computation from the
instance lengths done here."""

from __future__ import annotations

import json
import random
import statistics

import pyarrow as pa
import pytest
import torch

from benchmarks.command import compose_config as compose_benchmark
from benchmarks.pretrain_data import (
    PREPROCESSING,
    STAGES,
    benchmark_pretrain_data,
    time_collators,
)
from bertkit.errors import BertkitError
from bertkit.pretraining.batches import Phase, PhasedSampler
from bertkit.pretraining.corpora import corpus_documents
from bertkit.pretraining.objective import (
    packed_sequences_dataset,
    pair_instances_dataset,
    tokenize_documents,
)
from bertkit.training.models import load_tokenizer
from tests.conftest import real_data_dir
from tests.glue_fixtures import WORDS


def compose_config(overrides: list[str], with_hydra: bool = False):
    """The config `python -m benchmarks.pretrain_data <overrides>` runs."""
    return compose_benchmark("bench_pretrain_data", overrides, with_hydra)


N_DOCUMENTS, BATCH, REPEATS, MAX_LENGTH = 24, 4, 2, 32


def write_corpus(path, n_documents: int = N_DOCUMENTS) -> None:
    """Google's format: a sentence a line, a blank line between documents."""
    rng = random.Random(0)
    documents = ["\n".join(" ".join(rng.choices(WORDS, k=rng.randint(3, 12))) + " ."
                           for _ in range(rng.randint(2, 8)))
                 for _ in range(n_documents)]
    path.write_text("\n\n".join(documents) + "\n")


def bench_overrides(corpus_file, vocab, tmp_path, **extra) -> list[str]:
    overrides = {
        "corpus": "files",
        "corpus.files": f"['{corpus_file}']",
        "model.tokenizer": str(vocab),
        "cache_dir": str(tmp_path / "cache"),
        "pretraining.max_seq_length": MAX_LENGTH,
        "bench.batch_size": BATCH,
        "bench.repeats": REPEATS,
        **extra,
    }
    return [f"{key}={value}" for key, value in overrides.items()]


def pipeline_lengths(cfg, cache_dir, max_length: int = MAX_LENGTH) -> tuple[int, list[int]]:
    """(documents, instance lengths) from the pipeline's own functions, in a cache of our own."""
    documents = corpus_documents(cfg.corpus, str(cache_dir))
    tokenizer = load_tokenizer(cfg.model)
    tokenized = tokenize_documents(documents, tokenizer)
    if cfg.objective.packing == "full_sentences":
        instances = packed_sequences_dataset(tokenized, tokenizer, max_seq_length=max_length)
    else:
        instances = pair_instances_dataset(
            tokenized, tokenizer, max_seq_length=max_length,
            short_seq_prob=cfg.pretraining.short_seq_prob, seed=cfg.seed, copies=1,
            sentence_task=cfg.objective.sentence_task)
    return len(documents), [len(ids) for ids in instances["input_ids"]]


def share_of(lengths: list[int], order: list[int]) -> tuple[int, int]:
    """(real tokens, positions) of consecutive batches of BATCH, each padded to its longest."""
    real = positions = 0
    for start in range(0, len(order), BATCH):
        batch = [lengths[i] for i in order[start:start + BATCH]]
        real += sum(batch)
        positions += len(batch) * max(batch)
    return real, positions


@pytest.mark.slow
@pytest.mark.parametrize(("objective", "num_proc"),
                         [("mlm_nsp", 1), ("mlm_nsp", 2), ("mlm", "null")])
def test_benchmark_times_every_stage_and_counts_exactly(objective, num_proc, vocab_dir, tmp_path,
                                                        tmp_path_factory, monkeypatch):
    corpus = tmp_path / "corpus.txt"
    write_corpus(corpus)
    cfg = compose_config(bench_overrides(corpus, vocab_dir, tmp_path, objective=objective,
                                         **{"bench.num_proc": num_proc}))
    # Where the benchmark's temporary cache directories go: a short path, because num_proc > 1
    # starts a multiprocess Manager whose socket lives there, and a Unix socket's path is cut
    # at 108 bytes (tmp_path with this test's name and a three-digit pytest-N ran past it).
    scratch = tmp_path_factory.mktemp("t")
    monkeypatch.setattr("tempfile.tempdir", str(scratch))
    run_dir = tmp_path / "run"

    result = benchmark_pretrain_data(cfg, run_dir=run_dir)

    assert json.loads((run_dir / "bench.json").read_text()) == result
    # Nothing was read from or left in a cache: not the configured one, nor a temporary one.
    assert not (tmp_path / "cache").exists()
    assert list(scratch.iterdir()) == []

    n_documents, lengths = pipeline_lengths(cfg, tmp_path / "independent")
    n = len(lengths)
    assert result["documents"] == n_documents == N_DOCUMENTS
    assert result["instances"] == n > 2 * BATCH
    assert result["instance_tokens"] == sum(lengths)
    assert result["mean_instance_length"] == pytest.approx(sum(lengths) / n)
    assert result["corpus"]["bytes"] == corpus.stat().st_size
    assert result["packing"] == ("pairs" if objective == "mlm_nsp" else "full_sentences")
    expected_num_proc = None if num_proc == "null" else num_proc
    assert (result["num_proc"], result["repeats"], result["batch_size"]) == (
        expected_num_proc, REPEATS, BATCH)

    stages = result["stages"]
    assert list(stages) == [*STAGES, "preprocessing"]
    for name, stage in stages.items():
        assert len(stage["seconds_each_repeat"]) == REPEATS
        assert all(seconds > 0 for seconds in stage["seconds_each_repeat"])
        assert stage["seconds"] == pytest.approx(statistics.median(stage["seconds_each_repeat"]))
        assert stage["mb_per_second"] == pytest.approx(
            corpus.stat().st_size / 1e6 / stage["seconds"])
        if name not in ("read", "tokenize"):
            assert stage["instances_per_second"] == pytest.approx(n / stage["seconds"])
    for repeat in range(REPEATS):
        assert stages["preprocessing"]["seconds_each_repeat"][repeat] == pytest.approx(
            sum(stages[name]["seconds_each_repeat"][repeat] for name in PREPROCESSING))
    assert result["dynamic_mask_vs_hf_collator"] == pytest.approx(
        stages["dynamic_mask"]["instances_per_second"]
        / stages["hf_collator"]["instances_per_second"])

    # The shares, from the lengths: the sampler's order for the grouped batches, a seeded
    # permutation for the random ones.
    shares = result["real_token_share"]
    grouped_order = list(PhasedSampler([Phase(0, lengths, n)], BATCH, cfg.seed))
    assert sorted(grouped_order) == list(range(n))
    random_order = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.seed)).tolist()
    for key, order in (("grouped_by_length", grouped_order), ("random", random_order)):
        real, positions = share_of(lengths, order)
        assert shares[key]["real_tokens"] == real == sum(lengths)
        assert shares[key]["positions"] == positions
        assert shares[key]["real_token_share"] == pytest.approx(real / positions)
        assert shares[key]["batches"] == -(-n // BATCH)
    grouped, shuffled = shares["grouped_by_length"], shares["random"]
    assert shuffled["real_token_share"] <= grouped["real_token_share"] <= 1


def test_each_collator_gets_every_instance_once_with_its_columns(vocab_dir, tmp_path):
    corpus = tmp_path / "corpus.txt"
    write_corpus(corpus)
    cfg = compose_config(bench_overrides(corpus, vocab_dir, tmp_path))
    tokenizer = load_tokenizer(cfg.model)
    tokenized = tokenize_documents(corpus_documents(cfg.corpus, str(tmp_path / "c")), tokenizer)
    instances = pair_instances_dataset(tokenized, tokenizer, max_seq_length=MAX_LENGTH,
                                       short_seq_prob=0.1, seed=0)
    seen: dict[str, list[dict]] = {"bertkit": [], "hf": []}

    def recorder(name):
        def record(features):  # bertkit's rows come as one Arrow table (ArrowRows)
            if len(features) == 1 and isinstance(features[0], pa.Table):
                features = features[0].to_pylist()
            seen[name].extend(features)
        return record

    seconds = time_collators(instances, {"bertkit": (recorder("bertkit"), None),
                                         "hf": (recorder("hf"), ["input_ids", "token_type_ids"])},
                             batch_size=5)

    assert set(seconds) == {"bertkit", "hf"} and all(value >= 0 for value in seconds.values())
    rows = instances.to_list()
    assert seen["bertkit"] == [{key: row[key] for key in row if key != "length"} for row in rows]
    assert seen["hf"] == [{"input_ids": row["input_ids"], "token_type_ids": row["token_type_ids"]}
                          for row in rows]


def test_missing_corpus_file_is_a_bertkit_error(vocab_dir, tmp_path):
    cfg = compose_config(bench_overrides(tmp_path / "nope.txt", vocab_dir, tmp_path))
    with pytest.raises(BertkitError, match="nope.txt: no such file"):
        benchmark_pretrain_data(cfg, run_dir=tmp_path / "run")
    assert not (tmp_path / "run" / "bench.json").exists()


@pytest.mark.parametrize("setting", ["bench.batch_size=0", "bench.repeats=0",
                                     "bench.num_proc=0"])
def test_bench_settings_below_one_are_refused(setting, vocab_dir, tmp_path):
    corpus = tmp_path / "corpus.txt"
    write_corpus(corpus)
    cfg = compose_config([*bench_overrides(corpus, vocab_dir, tmp_path), setting])
    # The settings' ranges (benchmarks/settings.py), checked first, as the command does.
    with pytest.raises(BertkitError, match=rf"^{setting}: expected a number >= 1$"):
        benchmark_pretrain_data(cfg, run_dir=tmp_path / "run")


def test_hub_corpus_is_refused_before_any_download(vocab_dir, tmp_path):
    cfg = compose_config(bench_overrides(tmp_path / "x.txt", vocab_dir, tmp_path,
                                         corpus="wikipedia"))
    with pytest.raises(BertkitError, match="local corpus files"):
        benchmark_pretrain_data(cfg, run_dir=tmp_path / "run")


@pytest.mark.slow
@pytest.mark.real_data
def test_wikitext2_throughput_is_plausible(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTKIT_DATA", str(real_data_dir()))
    cfg = compose_config([f"cache_dir={tmp_path / 'cache'}",
                          "bench.repeats=1"])
    result = benchmark_pretrain_data(cfg, run_dir=tmp_path / "run")

    assert result["corpus"]["name"] == "wikitext2" and result["max_seq_length"] == 128
    assert result["corpus"]["bytes"] > 2_000_000  # valid + test, 2.4 MB
    assert result["documents"] > 100 and result["instances"] > 1000
    assert 64 < result["mean_instance_length"] <= 128
    # The rates are what the seconds measured (no floor on speed: a loaded machine is slow).
    for stage in result["stages"].values():
        assert stage["seconds"] > 0
        assert stage["mb_per_second"] == pytest.approx(
            result["corpus"]["bytes"] / 1e6 / stage["seconds"])
    assert result["dynamic_mask_vs_hf_collator"] > 0
    shares = result["real_token_share"]
    assert shares["random"]["real_token_share"] < shares["grouped_by_length"]["real_token_share"]
