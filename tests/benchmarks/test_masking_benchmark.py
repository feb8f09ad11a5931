"""The bench_masking recipe: its Google side is Google's create_masked_lm_predictions
re-derived (checked here against a second, plain reading of the same rules), bertkit's new
default gives Google's count on every instance, and the job writes its table."""

from __future__ import annotations

import json
import random

from benchmarks.command import compose_config as compose_benchmark
from benchmarks.masking_fidelity import benchmark_masking, google_masking
from tests.benchmarks.test_pretrain_data_benchmark import write_corpus


def compose_config(overrides: list[str], with_hydra: bool = False):
    """The config `python -m benchmarks.masking_fidelity <overrides>` runs."""
    return compose_benchmark("bench_masking", overrides, with_hydra)


def test_google_side_counts_and_never_chooses_cls_or_sep():
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(50)]
    rng = random.Random(0)
    for length in range(1, 140):
        tokens = ["[CLS]", *(rng.choice(words[1:]) for _ in range(max(0, length - 2))), "[SEP]"]
        tokens = tokens[:length]
        output, positions = google_masking(tokens, 0.15, 20, words, rng)
        candidates = [i for i, t in enumerate(tokens) if t not in ("[CLS]", "[SEP]")]
        assert len(positions) == min(20, max(1, int(round(length * 0.15))), len(candidates))
        assert set(positions) <= set(candidates) and positions == sorted(positions)
        assert all(output[i] == tokens[i] for i in range(length) if i not in positions)


def test_bench_masking_writes_the_comparison(vocab_dir, tmp_path):
    corpus = tmp_path / "corpus.txt"
    write_corpus(corpus)
    cfg = compose_config(["corpus=files", f"corpus.files=['{corpus}']",
                          f"model.tokenizer={vocab_dir}", f"cache_dir={tmp_path / 'cache'}",
                          "pretraining.max_seq_length=32", "bench.instances=300"])
    result = benchmark_masking(cfg, tmp_path / "run")
    assert json.loads((tmp_path / "run" / "masking.json").read_text()) == result
    maskings = result["maskings"]
    assert result["instances"] == 300
    assert maskings["bertkit_google"]["identical_counts_share"] == 1.0
    assert maskings["bertkit_non_special"]["count_difference_shares"]["1"] == 0.0
    for masking in maskings.values():
        assert masking["instances"] == 300 and masking["cls_sep_chosen"] == 0
        assert 0 in masking["positions_never_chosen"]
