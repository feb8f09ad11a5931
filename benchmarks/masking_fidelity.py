"""The bench_masking job: bertkit's masking against Google's create_pretraining_data.py,
statistic for statistic, on the same NSP instances (bertkit's, built from the corpus with the
recipe's objective and vocabulary).

Google's side is a re-derivation of create_masked_lm_predictions (token units) written here
from reading Google's code, not a copy of it: candidates every token but [CLS] and [SEP],
shuffled with Python's random.Random, num_to_predict = min(max_predictions_per_seq,
max(1, int(round(len(tokens) * masked_lm_prob)))), then per position [MASK] at random() < 0.8,
else unchanged at random() < 0.5, else vocab_words[randint(0, len - 1)]. It makes the same
calls on the generator in the same order, so with the same seed it gives Google's function's
very output (cards/pretrain.md says how that was checked). bertkit's file never runs Google's
code: a file is read as data, never executed.

Each masking is run on every instance: Google's, and bertkit's under each masking.convention
(google, the default; non_special, bertkit's rule before issue 51). Writes masking.json and
prints a markdown table."""

from __future__ import annotations

import logging
import math
import random
import tempfile
from pathlib import Path

import datasets
import numpy as np
from omegaconf import DictConfig, OmegaConf

from benchmarks.command import main
from benchmarks.report import markdown_head, publish
from benchmarks.settings import check_settings
from bertkit.errors import BertkitError
from bertkit.jobs import Job
from bertkit.pretraining.corpora import corpus_documents
from bertkit.pretraining.masking import (
    CONVENTIONS,
    IGNORE_INDEX,
    Vocabulary,
    mask_sequence,
    masking_rule_from_config,
)
from bertkit.pretraining.objective import objective_of, tokenize_documents
from bertkit.training.models import load_tokenizer
from bertkit.training.run import hydra_run_dir

RESULT_FILE = "masking.json"  # written last (JOB names it)
DIFFERENCES = (-3, -2, -1, 0, 1, 2, 3)  # instances at each count difference from Google's

logger = logging.getLogger(__name__)


def google_masking(tokens: list[str], masked_lm_prob: float, max_predictions: int,
                   vocab_words: list[str], rng: random.Random) -> tuple[list[str], list[int]]:
    """(output tokens, sorted masked positions) as create_masked_lm_predictions makes them
    with one-token units (do_whole_word_mask false, Google's default)."""
    candidates = [i for i, token in enumerate(tokens) if token not in ("[CLS]", "[SEP]")]
    rng.shuffle(candidates)
    output = list(tokens)
    count = min(max_predictions, max(1, int(round(len(tokens) * masked_lm_prob))))
    positions = []
    for index in candidates[:count]:
        if rng.random() < 0.8:
            output[index] = "[MASK]"
        elif rng.random() >= 0.5:  # else kept as it is
            output[index] = vocab_words[rng.randint(0, len(vocab_words) - 1)]
        positions.append(index)
    return output, sorted(positions)


class Tally:
    """One masking's statistics over the instances."""

    def __init__(self, width: int):
        self.counts: list[int] = []
        self.outcomes = {"mask": 0, "random": 0, "kept": 0}
        self.random_special = 0
        self.unk_masked = 0
        self.cls_sep_chosen = 0
        self.chosen_at = np.zeros(width, dtype=np.int64)

    def add(self, original: list[str], output: list[str], positions, specials: set[str]):
        self.counts.append(len(positions))
        for position in positions:
            self.chosen_at[position] += 1
            token, fed = original[position], output[position]
            outcome = "mask" if fed == "[MASK]" else "kept" if fed == token else "random"
            self.outcomes[outcome] += 1
            self.random_special += outcome == "random" and fed in specials
            self.unk_masked += token == "[UNK]"
            self.cls_sep_chosen += token in ("[CLS]", "[SEP]")

    def summary(self, google_counts: list[int] | None, unk_tokens: int, width_seen: int) -> dict:
        counts = np.array(self.counts)
        predicted = int(counts.sum())
        out = {
            "instances": len(counts),
            "predictions": predicted,
            "mean_per_instance": float(counts.mean()),
            "percentiles": {str(q): float(np.percentile(counts, q)) for q in (5, 25, 50, 75, 95)},
            "min": int(counts.min()), "max": int(counts.max()),
            "shares": {name: n / predicted for name, n in self.outcomes.items()},
            "random_special_share": self.random_special / max(1, self.outcomes["random"]),
            "unk_masked_share": self.unk_masked / unk_tokens if unk_tokens else None,
            "unk_predictions": self.unk_masked,
            "cls_sep_chosen": self.cls_sep_chosen,
            "positions_never_chosen": [int(p) for p in np.flatnonzero(self.chosen_at == 0)
                                       if p < width_seen],
        }
        if google_counts is not None:
            difference = counts - np.array(google_counts)
            out["count_difference_shares"] = {
                str(d): float((difference == d).mean()) for d in DIFFERENCES}
            out["count_difference_other"] = float((~np.isin(difference, DIFFERENCES)).mean())
            out["identical_counts_share"] = float((difference == 0).mean())
        return out


def _instances(corpus: DictConfig, objective_cfg: DictConfig, pretraining: DictConfig, seed: int,
               tokenizer, wanted: int, cache_dir: str) -> datasets.Dataset:
    """The first `wanted` instances of as many copies (dupe_factor) as it takes."""
    documents = corpus_documents(corpus, cache_dir)
    tokenized = tokenize_documents(documents, tokenizer)
    objective = objective_of(objective_cfg)

    def build(copies: int):
        return objective.instances(
            tokenized, tokenizer, max_seq_length=int(pretraining.max_seq_length),
            short_seq_prob=pretraining.short_seq_prob, seed=seed, copies=copies,
            num_proc=None)

    instances = build(1)
    if len(instances) == 0:
        raise BertkitError(f"corpus {corpus.name}: no instance could be built")
    copies = 1
    while len(instances) < wanted:  # copies' counts vary with their cuts
        copies = math.ceil(copies * wanted / len(instances) * 1.02)
        instances = build(copies)
    return instances.select(range(wanted))


def benchmark_masking(cfg: DictConfig, run_dir: Path | None = None) -> dict:
    check_settings(cfg)
    run_dir = Path(run_dir or hydra_run_dir())
    wanted = int(cfg.bench.instances)  # at least 1 (config_schema's BenchSchema)
    if cfg.masking.unit != "token":
        raise BertkitError(f"masking.unit={cfg.masking.unit}: bench_masking compares token "
                           f"masking (Google's default, do_whole_word_mask=false)")
    tokenizer = load_tokenizer(cfg.model, job="pretraining")
    vocab = Vocabulary.from_tokenizer(tokenizer)
    vocab_words = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    specials = set(tokenizer.all_special_tokens)
    base = OmegaConf.to_container(cfg.masking)
    rules = {convention: masking_rule_from_config(OmegaConf.create({**base,
                                                                    "convention": convention}))
             for convention in CONVENTIONS}
    progress_bars = datasets.utils.logging.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        with tempfile.TemporaryDirectory(prefix="bertkit-bench-masking-") as cache_dir:
            instances = _instances(cfg.corpus, cfg.objective, cfg.pretraining, cfg.seed,
                                   tokenizer, wanted, cache_dir)
            rows = instances["input_ids"]
    finally:
        if progress_bars:
            datasets.enable_progress_bars()
    width = int(cfg.pretraining.max_seq_length)
    names = ["google_create_pretraining_data", *(f"bertkit_{c}" for c in CONVENTIONS)]
    tallies = {name: Tally(width) for name in names}
    google_rng = random.Random(int(cfg.seed))
    bertkit_rng = np.random.default_rng(int(cfg.seed))
    unk_tokens = longest = 0
    for ids in rows:
        tokens = tokenizer.convert_ids_to_tokens(ids)
        unk_tokens += tokens.count("[UNK]")
        longest = max(longest, len(ids))
        output, positions = google_masking(tokens, rules["google"].mlm_probability,
                                           rules["google"].max_predictions_per_seq, vocab_words,
                                           google_rng)
        tallies[names[0]].add(tokens, output, positions, specials)
        for convention in CONVENTIONS:
            masked, labels = mask_sequence(ids, vocab, rules[convention], bertkit_rng)
            tallies[f"bertkit_{convention}"].add(
                tokens, tokenizer.convert_ids_to_tokens(masked.tolist()),
                np.flatnonzero(labels != IGNORE_INDEX), specials)
    google_counts = tallies[names[0]].counts
    lengths = np.array([len(ids) for ids in rows])
    result = {
        "recipe": cfg.recipe.name,
        "corpus": {"name": cfg.corpus.name,
                   "files": [str(f) for f in OmegaConf.select(cfg.corpus, "files") or []]},
        "tokenizer": str(cfg.model.tokenizer),
        "vocab_size": len(tokenizer),
        "objective": cfg.objective.name,
        "max_seq_length": width,
        "mlm_probability": rules["google"].mlm_probability,
        "max_predictions_per_seq": rules["google"].max_predictions_per_seq,
        "seed": int(cfg.seed),
        "instances": len(rows),
        "mean_instance_length": float(lengths.mean()),
        "unk_tokens": unk_tokens,
        "google_side": "a re-derivation of create_masked_lm_predictions (token units) making "
                       "the same random.Random calls in the same order",
        "maskings": {name: tally.summary(None if name == names[0] else google_counts,
                                         unk_tokens, longest)
                     for name, tally in tallies.items()},
    }
    publish(result, run_dir / RESULT_FILE, _table)
    return result


LABELS = {"google_create_pretraining_data": "Google (create_pretraining_data.py)",
          "bertkit_non_special": "bertkit before (non_special)",
          "bertkit_google": "bertkit now (google, default)"}


def _table(result: dict, path: Path) -> str:
    maskings = result["maskings"]
    order = ["google_create_pretraining_data", "bertkit_non_special", "bertkit_google"]
    lines = [f"\nbench_masking {result['corpus']['name']}: {result['instances']:,} "
             f"{result['objective']} instances of up to {result['max_seq_length']} tokens (mean "
             f"{result['mean_instance_length']:.1f}), {result['unk_tokens']:,} [UNK] tokens, "
             f"p {result['mlm_probability']}, at most {result['max_predictions_per_seq']}",
             "", *markdown_head("statistic", *(LABELS[name] for name in order))]

    def row(label: str, values) -> None:
        lines.append(f"| {label} | " + " | ".join(values) + " |")

    row("masked per instance, mean", [f"{maskings[n]['mean_per_instance']:.4f}" for n in order])
    for q in ("5", "25", "50", "75", "95"):
        row(f"masked per instance, p{q}", [f"{maskings[n]['percentiles'][q]:g}" for n in order])
    row("masked per instance, min-max", [f"{maskings[n]['min']}-{maskings[n]['max']}"
                                         for n in order])
    for d in DIFFERENCES:
        if any(maskings[n].get("count_difference_shares", {}).get(str(d)) for n in order[1:]):
            row(f"instances at count - Google's = {d:+d}",
                ["-"] + [f"{maskings[n]['count_difference_shares'][str(d)]:.2%}"
                         for n in order[1:]])
    for outcome, label in (("mask", "[MASK]"), ("random", "random token"), ("kept", "kept")):
        row(f"{label} share of predictions",
            [f"{maskings[n]['shares'][outcome]:.2%}" for n in order])
    row("random replacements that are special tokens",
        [f"{maskings[n]['random_special_share']:.3%}" for n in order])
    row("[UNK] tokens masked (share of all [UNK])",
        [f"{maskings[n]['unk_masked_share']:.2%}" if maskings[n]["unk_masked_share"] is not None
         else "n/a" for n in order])
    row("[CLS]/[SEP] chosen", [str(maskings[n]["cls_sep_chosen"]) for n in order])
    row("positions never chosen", [", ".join(map(str, maskings[n]["positions_never_chosen"]))
                                   or "none" for n in order])
    lines.append(f"\nresult: {path}")
    return "\n".join(lines)


# What `python -m benchmarks.masking_fidelity` runs: its job on its primary config,
# benchmarks/conf/bench_masking.yaml.
CONFIG = "bench_masking"
JOB = Job("benchmarks.masking_fidelity:benchmark_masking", RESULT_FILE)

if __name__ == "__main__":
    main(JOB, CONFIG)
