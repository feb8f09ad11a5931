"""The bench_pretrain_data job: throughput of recipe=pretrain's data pipeline stage by stage
(read, tokenize, instances, static masks), in MB of raw corpus text per second from a fresh
cache each repeat; bertkit's dynamic-masking collator against DataCollatorForLanguageModeling
on the same batches; and the real-token share of length-grouped against random batches.
docs/speed.md ("How bench-pretrain-data measures") says what each stage covers.
Writes bench.json and prints a table."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerBase

from benchmarks.command import main
from benchmarks.measure import median_seconds, ratio, timed
from benchmarks.report import publish
from benchmarks.settings import check_settings
from benchmarks.side_by_side import alternating
from bertkit.errors import BertkitError
from bertkit.jobs import Job
from bertkit.pretraining.batches import ArrowRows, Phase, PhasedSampler
from bertkit.pretraining.corpora import corpus_documents, corpus_files, ensure_demo_corpus
from bertkit.pretraining.masking import (
    DynamicMaskingCollator,
    Vocabulary,
    masking_rule_from_config,
    static_masked_copies,
)
from bertkit.pretraining.objective import objective_of, tokenize_documents
from bertkit.training.models import load_tokenizer
from bertkit.training.run import hydra_run_dir

RESULT_FILE = "bench.json"  # written last (JOB names it)

logger = logging.getLogger(__name__)

MB = 1_000_000
STAGES = ("read", "tokenize", "instances", "static_mask", "dynamic_mask", "hf_collator")
PREPROCESSING = STAGES[:4]  # what recipe=pretrain runs before training (static masks, 1 copy)
COLLATORS = ("dynamic_mask", "hf_collator")
HF_COLUMNS = ("input_ids", "token_type_ids")


# Real-token shares


def random_order(n: int, seed: int) -> list[int]:
    """The random batch order the shares are computed for: torch.randperm seeded with seed."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()


def grouped_order(lengths: Sequence[int], batch_size: int, seed: int) -> list[int]:
    """One pass over the instances as training draws them (one phase, grouped by length)."""
    sampler = PhasedSampler([Phase(0, lengths, len(lengths))], batch_size, seed)
    return list(sampler)


def padding_counts(lengths: Sequence[int], order: Sequence[int], batch_size: int) -> dict:
    """Real tokens and padded positions of consecutive batches of `order`, each padded to its
    longest instance."""
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.asarray(order, dtype=np.int64)
    real = positions = batches = 0
    for start in range(0, len(order), batch_size):
        batch = lengths[order[start:start + batch_size]]
        real += int(batch.sum())
        positions += int(batch.size * batch.max())
        batches += 1
    return {"batches": batches, "real_tokens": real, "positions": positions,
            "real_token_share": real / positions if positions else 0.0,
            "mean_padded_length": positions / len(order) if len(order) else 0.0}


# The timed stages


@dataclass(frozen=True)
class _Stages:
    """The settings the timed stages read: the corpus, masking, objective and pretraining
    nodes, and the seed."""

    corpus: DictConfig
    masking: DictConfig
    objective: DictConfig
    pretraining: DictConfig
    seed: int


def _instances(objective: DictConfig, pretraining: DictConfig, seed: int,
               tokenized: datasets.Dataset, tokenizer: PreTrainedTokenizerBase,
               num_proc: int | None) -> datasets.Dataset:
    """One copy of the training instances, as recipe=pretrain builds them for its first phase."""
    length = int(pretraining.max_seq_length)
    return objective_of(objective).instances(
        tokenized, tokenizer, max_seq_length=length, short_seq_prob=pretraining.short_seq_prob,
        seed=seed, copies=1, num_proc=num_proc)


def time_collators(instances: datasets.Dataset,
                   collators: dict[str, tuple[Callable, Sequence[str] | None]],
                   batch_size: int) -> dict[str, float]:
    """Seconds each collator's batches cost, every instance once, in batches of batch_size,
    as Trainer's DataLoader pays them: the rows fetched (bertkit's as one Arrow table through
    ArrowRows, the plain way's as datasets' list of dicts) and collated.

    collators: name -> (collator, the instance columns it gets; None: all but `length`, which
    Trainer drops as no model input; bertkit's reads them as an Arrow table). Each batch goes
    to every collator, in alternating order, so that all see the same data in the same state
    of the process."""
    names = list(collators)
    seconds = dict.fromkeys(names, 0.0)
    every = [column for column in instances.column_names if column != "length"]
    sources = {name: ArrowRows(instances.select_columns(columns or every))
               if columns is None else instances.select_columns(columns)
               for name, (_, columns) in collators.items()}
    for number, start in enumerate(range(0, len(instances), batch_size)):
        indices = list(range(start, min(start + batch_size, len(instances))))
        for name in alternating(names, number):
            seconds[name] += timed(_fetch_and_collate, collators[name][0], sources[name],
                                   indices, sync=False)[1]
    return seconds


def _fetch_and_collate(collate: Callable, source, indices: list[int]) -> dict:
    return collate(source.__getitems__(indices))


def _one_repeat(stages: _Stages, tokenizer: PreTrainedTokenizerBase, collators: dict,
                num_proc: int | None, batch_size: int, cache_dir: str) -> tuple[dict, dict]:
    """Every stage once, from the files, with its outputs written under cache_dir."""
    vocab = Vocabulary.from_tokenizer(tokenizer)
    rule = masking_rule_from_config(stages.masking)
    seconds = {}
    documents, seconds["read"] = timed(corpus_documents, stages.corpus, cache_dir,
                                       num_proc=num_proc, sync=False)
    tokenized, seconds["tokenize"] = timed(tokenize_documents, documents, tokenizer,
                                           num_proc=num_proc, sync=False)
    instances, seconds["instances"] = timed(_instances, stages.objective, stages.pretraining,
                                            stages.seed, tokenized, tokenizer, num_proc,
                                            sync=False)
    if len(instances) == 0:
        raise BertkitError(f"corpus {stages.corpus.name}: no training instance of up to "
                           f"{stages.pretraining.max_seq_length} tokens could be built")

    seconds["static_mask"] = timed(static_masked_copies, instances, vocab, rule, dupe_factor=1,
                                   seed=stages.seed, num_proc=num_proc, sync=False)[1]

    torch.manual_seed(stages.seed)  # both collators draw from torch's RNG, as under Trainer
    seconds.update(time_collators(instances, collators, batch_size))
    outputs = {"documents": len(documents), "tokenized_documents": len(tokenized),
               "lengths": [int(value) for value in instances["length"]]}
    return seconds, outputs


# The benchmark


def _check(bench: DictConfig, corpus: DictConfig,
           trains_tokenizer: bool) -> tuple[int, int | None, int]:
    """trains_tokenizer: tokenizer_training.enabled."""
    batch_size, repeats = int(bench.batch_size), int(bench.repeats)
    num_proc = None if bench.num_proc is None else int(bench.num_proc)
    if batch_size < 1 or (num_proc is not None and num_proc < 1) or repeats < 1:
        raise BertkitError(f"bench: batch_size ({batch_size}), num_proc ({num_proc}) and repeats "
                           f"({repeats}) must be at least 1 (num_proc may also be null)")
    if corpus.source != "local":
        raise BertkitError(f"bench_pretrain_data measures local corpus files (their size is the "
                           f"MB of MB/s), not corpus.source={corpus.source}; use a local "
                           f"corpus, e.g. corpus=wikitext2 or corpus=files corpus.files=[...]")
    if trains_tokenizer:
        raise BertkitError("bench_pretrain_data measures a given vocabulary (model.tokenizer); "
                           "set tokenizer_training.enabled=false")
    return batch_size, num_proc, repeats


def _stage(name: str, times: list[float], corpus_bytes: int, instances: int | None,
           batches: int | None = None) -> dict:
    timing = median_seconds(times)
    seconds = timing["seconds"]
    entry = {"description": DESCRIPTIONS[name], **timing,
             "mb_per_second": corpus_bytes / MB / seconds}
    if instances is not None:
        entry["instances_per_second"] = instances / seconds
    if batches is not None:
        entry["ms_per_batch"] = 1000 * seconds / batches
    return entry


DESCRIPTIONS = {
    "read": "reading the corpus files, sentence splitting, writing the documents (Arrow)",
    "tokenize": "WordPiece ids per sentence (tokenize_documents)",
    "instances": "training instances at max_seq_length, one copy",
    "static_mask": "static masks, one copy (static_masked_copies, dupe_factor=1)",
    "dynamic_mask": "DynamicMaskingCollator over every instance once (one epoch), the rows "
                    "fetched as training fetches them (ArrowRows)",
    "hf_collator": "transformers DataCollatorForLanguageModeling over every instance once, the "
                   "rows fetched as datasets' list of dicts",
    "preprocessing": "read + tokenize + instances + static_mask, per repeat",
}


def _timed_repeats(stages: _Stages, tokenizer, collators: dict, num_proc: int, batch_size: int,
                   repeats: int) -> tuple[dict[str, list[float]], dict]:
    """Seconds per stage and repeat, each repeat in a fresh cache (no stage is a cache hit),
    and the last repeat's outputs."""
    times: dict[str, list[float]] = {name: [] for name in STAGES}
    outputs: dict = {}
    progress_bars = datasets.utils.logging.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        for repeat in range(repeats):
            logger.info("bench: repeat %d of %d", repeat + 1, repeats)
            with tempfile.TemporaryDirectory(prefix="bertkit-bench-") as cache_dir:
                seconds, outputs = _one_repeat(stages, tokenizer, collators, num_proc,
                                               batch_size, cache_dir)
            for name in STAGES:
                times[name].append(seconds[name])
    finally:
        if progress_bars:
            datasets.enable_progress_bars()
    return times, outputs


def benchmark_pretrain_data(cfg: DictConfig, run_dir: Path | None = None) -> dict:
    check_settings(cfg)
    run_dir = Path(run_dir or hydra_run_dir())
    batch_size, num_proc, repeats = _check(
        cfg.bench, cfg.corpus, OmegaConf.select(cfg, "tokenizer_training.enabled", default=False))
    synthetic = OmegaConf.select(cfg.corpus, "synthetic")
    if synthetic is not None:  # corpus=demo: generated on first use (not timed)
        ensure_demo_corpus(Path(cfg.corpus.files[0]), OmegaConf.to_container(synthetic))
    files = corpus_files(cfg.corpus)  # a missing file fails here, before any timing
    corpus_bytes = sum(path.stat().st_size for path in files)
    if corpus_bytes == 0:
        raise BertkitError(f"corpus {cfg.corpus.name}: its files are empty")
    tokenizer = load_tokenizer(cfg.model, job="pretraining")
    rule = masking_rule_from_config(cfg.masking)
    length = int(cfg.pretraining.max_seq_length)
    hf_collator = DataCollatorForLanguageModeling(
        tokenizer, mlm_probability=cfg.masking.mlm_probability)
    collators = {
        # As in training: the phase's rule, every instance column but `length`. Neither pads
        # to a multiple (training does so only under mixed precision).
        "dynamic_mask": (DynamicMaskingCollator(tokenizer, [(length, rule)]), None),
        "hf_collator": (hf_collator, list(HF_COLUMNS)),
    }

    stages = _Stages(cfg.corpus, cfg.masking, cfg.objective, cfg.pretraining, cfg.seed)
    times, outputs = _timed_repeats(stages, tokenizer, collators, num_proc, batch_size, repeats)
    lengths = outputs["lengths"]
    n = len(lengths)
    batches = -(-n // batch_size)
    stages = {name: _stage(name, times[name], corpus_bytes,
                           n if name not in ("read", "tokenize") else None,
                           batches if name in collators else None) for name in STAGES}
    totals = [sum(times[name][repeat] for name in PREPROCESSING) for repeat in range(repeats)]
    stages["preprocessing"] = _stage("preprocessing", totals, corpus_bytes, n)
    grouped = padding_counts(lengths, grouped_order(lengths, batch_size, cfg.seed), batch_size)
    shuffled = padding_counts(lengths, random_order(n, cfg.seed), batch_size)
    result = {
        "recipe": cfg.recipe.name,
        "corpus": {"name": cfg.corpus.name, "format": cfg.corpus.format,
                   "files": [str(path) for path in files], "bytes": corpus_bytes,
                   "mb": corpus_bytes / MB},
        "tokenizer": str(cfg.model.tokenizer),
        "vocab_size": len(tokenizer),
        "objective": cfg.objective.name,
        "packing": cfg.objective.packing,
        "max_seq_length": length,
        "masking": {"mlm_probability": rule.mlm_probability,
                    "max_predictions_per_seq": rule.max_predictions_per_seq, "unit": rule.unit},
        "num_proc": num_proc,
        "repeats": repeats,
        "batch_size": batch_size,
        "seed": int(cfg.seed),
        "torch_threads": torch.get_num_threads(),
        "documents": outputs["documents"],
        "tokenized_documents": outputs["tokenized_documents"],
        "instances": n,
        "instance_tokens": int(sum(lengths)),
        "mean_instance_length": float(np.mean(lengths)),
        "timing": "wall time per stage, median over repeats; each repeat reads the corpus into "
                  "a fresh temporary cache directory, so no stage is a cache hit; MB/s = corpus "
                  "file bytes / 10^6 / seconds; the collators are timed on fetching the rows as "
                  "Trainer's DataLoader does and collating them, batch by batch in alternating "
                  "order",
        "stages": stages,
        "dynamic_mask_vs_hf_collator": ratio(stages["dynamic_mask"]["instances_per_second"],
                                             stages["hf_collator"]["instances_per_second"]),
        "real_token_share": {"batch_size": batch_size, "grouped_by_length": grouped,
                             "random": shuffled},
    }
    publish(result, run_dir / RESULT_FILE, _table)
    return result


LABELS = {
    "read": "read + sentence split",
    "tokenize": "tokenize",
    "instances": "instances",
    "static_mask": "static masking, 1 copy",
    "dynamic_mask": "dynamic masking (bertkit)",
    "hf_collator": "DataCollatorForLanguageModeling",
    "preprocessing": "read..static, 1 copy",
}


def _table(result: dict, path: Path) -> str:
    corpus = result["corpus"]
    share = result["real_token_share"]
    instances = f"{result['packing']} instances" if result["packing"] != "pairs" \
        else "pair instances"
    lines = [
        f"\nbench_pretrain_data {corpus['name']}: {corpus['mb']:.2f} MB in "
        f"{len(corpus['files'])} file(s), {result['documents']:,} documents -> "
        f"{result['instances']:,} {instances} of up to {result['max_seq_length']} tokens "
        f"(mean {result['mean_instance_length']:.1f}); num_proc "
        f"{'null (no pool)' if result['num_proc'] is None else result['num_proc']}, "
        f"{result['repeats']} repeat(s), batch {result['batch_size']}, "
        f"{result['torch_threads']} torch threads",
        f"  {'stage':<33} {'seconds':>8} {'MB/s':>8} {'instances/s':>12}",
    ]
    for name, values in result["stages"].items():
        per_second = values.get("instances_per_second")
        rate = f"{per_second:>12,.0f}" if per_second is not None else f"{'':>12}"
        lines.append(f"  {LABELS[name]:<33} {values['seconds']:>8.3f} "
                     f"{values['mb_per_second']:>8.2f} {rate}".rstrip())
    lines.append(f"  ratio dynamic masking bertkit / DataCollatorForLanguageModeling: "
                 f"{result['dynamic_mask_vs_hf_collator']:.2f}x (instances/s)")
    lines.append(f"  real tokens in batches of {share['batch_size']}: grouped by length "
                 f"{share['grouped_by_length']['real_token_share']:.1%}, random order "
                 f"{share['random']['real_token_share']:.1%}")
    lines.append(f"  result: {path}")
    return "\n".join(lines)


# What `python -m benchmarks.pretrain_data` runs: its job on its primary config,
# benchmarks/conf/bench_pretrain_data.yaml.
CONFIG = "bench_pretrain_data"
JOB = Job("benchmarks.pretrain_data:benchmark_pretrain_data", RESULT_FILE)

if __name__ == "__main__":
    main(JOB, CONFIG)
