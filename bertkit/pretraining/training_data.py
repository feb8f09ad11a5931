"""The pretraining data, built once per run: the corpus's documents (the held-out share split
off first), the WordPiece vocabulary, then instances per phase (sentence pairs for NSP/SOP,
packed full sentences for MLM alone) with static masks stored on disk or a collator that draws
dynamic masks. Every step runs through datasets.map and is cached by fingerprint, so a rerun
or a sweep job reuses it.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
from omegaconf import DictConfig, OmegaConf
from transformers import PreTrainedTokenizerBase, TrainingArguments

from bertkit.data.atomic_files import discard_damaged_arrow_cache
from bertkit.errors import BertkitError
from bertkit.pretraining.corpora import corpus_documents
from bertkit.pretraining.demo_corpus import ensure_demo_corpus
from bertkit.pretraining.dynamic_masking import DynamicMaskingCollator, StaticMasksCollator
from bertkit.pretraining.heldout import (
    HeldoutSet,
    build_heldout,
    check_corpus_size,
    check_training_share,
    heldout_settings,
    split_documents,
)
from bertkit.pretraining.instances import streaming_instances, tokenize_documents
from bertkit.pretraining.masking import (
    Vocabulary,
    masking_rule_from_config,
    most_predictions,
)
from bertkit.pretraining.objective import objective_of
from bertkit.pretraining.padding_free import (
    PackingPlan,
    pack_shapes,
    padding_free_wanted,
)
from bertkit.pretraining.phases import Phase, phase_steps
from bertkit.pretraining.static_masking import static_masked_copies
from bertkit.pretraining.wordpiece import ensure_trained_tokenizer, trained_tokenizer_dir
from bertkit.training.models import load_tokenizer
from bertkit.training.progress import every_bar_shown, preprocessing_stage
from bertkit.training.static_shapes import static_shapes_pay

logger = logging.getLogger(__name__)


@dataclass
class PretrainingData:
    """What prepare_pretraining_data builds once per process group."""

    tokenizer: PreTrainedTokenizerBase
    train_dataset: object
    phases: list[Phase] | None
    collator: object
    seconds: float
    heldout: HeldoutSet | None = None  # None: heldout.fraction=0
    train_documents: int | None = None  # None: a stream
    # Padding-free batches (bertkit.pretraining.padding_free), or None: padded ones, grouped
    # by length or not (bertkit.pretraining.phases).
    packing: PackingPlan | None = None
    group_by_length: bool = True


@dataclass(frozen=True)
class DataSettings:
    """The nodes and keys a pretraining job's data preparation reads, taken once at its entry
    (data_settings)."""

    corpus: DictConfig
    model: DictConfig | None
    tokenizer_training: DictConfig | None
    pretraining: DictConfig | None
    masking: DictConfig | None
    objective: DictConfig
    heldout: DictConfig
    cache_dir: str
    preprocessing_num_workers: int | None
    seed: int | None
    pad_to_multiple_of: int | None
    static_shapes: bool  # batches at their phase's length (static_shapes.static_shapes_pay)
    library_bars: bool  # datasets' bars inside a stage too (progress.every_bar_shown)


def data_settings(cfg: DictConfig) -> DataSettings:
    """The job's DataSettings, from its config."""
    return DataSettings(
        corpus=cfg.corpus, model=OmegaConf.select(cfg, "model"),
        tokenizer_training=OmegaConf.select(cfg, "tokenizer_training"),
        pretraining=OmegaConf.select(cfg, "pretraining"),
        masking=OmegaConf.select(cfg, "masking"), objective=cfg.objective,
        heldout=heldout_settings(cfg), cache_dir=cfg.cache_dir,
        preprocessing_num_workers=cfg.preprocessing_num_workers,
        seed=OmegaConf.select(cfg, "seed"),
        pad_to_multiple_of=OmegaConf.select(cfg, "pad_to_multiple_of"),
        static_shapes=static_shapes_pay(cfg),
        library_bars=every_bar_shown(cfg.progress_bars))


# The stages of the data preparation, in order: each prints one line when it ends (its count
# and time) in place of datasets' bars for each of its maps (bertkit.training.progress).
READING, HOLDING_OUT, VOCABULARY, TOKENIZING, INSTANCES, HELDOUT_SET = STAGES = (
    "pretraining data 1/6, reading the corpus",
    "pretraining data 2/6, holding out documents",
    "pretraining data 3/6, the vocabulary",
    "pretraining data 4/6, tokenizing the documents",
    "pretraining data 5/6, building the training instances",
    "pretraining data 6/6, building the held-out set",
)


def prepare_pretraining_data(job: DataSettings, args: TrainingArguments) -> PretrainingData:
    started = time.perf_counter()
    # Held-out documents never reach the vocabulary nor the training data.
    documents, heldout_docs = split_corpus(job)
    with stage(job, VOCABULARY) as made:
        tokenizer = pretraining_tokenizer(job.tokenizer_training, job.model, job.corpus,
                                          job.cache_dir, documents)
        made.count, made.unit = len(tokenizer), "tokens" + (
            "" if job.tokenizer_training.enabled else f" ({job.model.tokenizer}, as given)")
    train_dataset, phases, collator, packing = build_training_data(job, documents, tokenizer,
                                                                   args)
    heldout = None
    if heldout_docs is not None:
        with stage(job, HELDOUT_SET) as made:
            heldout = build_heldout(job.heldout, job.pretraining, job.objective,
                                    tokenizer, heldout_docs)
            made.count = len(heldout.mlm) + (0 if heldout.pairs is None else len(heldout.pairs))
            made.unit = "sequences"
    train_documents = len(documents) if isinstance(documents, datasets.Dataset) else None
    return PretrainingData(tokenizer, train_dataset, phases, collator,
                           time.perf_counter() - started, heldout, train_documents, packing,
                           group_by_length=not job.static_shapes)


def is_streaming(corpus: DictConfig) -> bool:
    return corpus.source == "hub" and bool(OmegaConf.select(corpus, "hub.streaming"))


def _corpus_fingerprint(corpus: DictConfig, documents) -> str:
    """The dataset's own fingerprint; a stream has none, so its settings stand in for it."""
    if isinstance(documents, datasets.Dataset):
        return documents._fingerprint
    return hashlib.sha256(OmegaConf.to_yaml(corpus, resolve=True).encode()).hexdigest()[:16]


def pretraining_documents(corpus: DictConfig, cache_dir: str, num_proc: int | None):
    """The corpus's documents (the demo corpus generated first if it is the one).

    Every later step (tokenised documents, instances, static-mask copies, held-out sets) is a
    datasets.map cached beside the corpus's Arrow file, and datasets reads a cached file it
    finds without checking it: the caches are checked first and a cut one is deleted, to be
    rebuilt (bertkit.data.atomic_files). num_proc: preprocessing_num_workers."""
    synthetic = OmegaConf.select(corpus, "synthetic")
    if synthetic is not None:
        ensure_demo_corpus(Path(corpus.files[0]), OmegaConf.to_container(synthetic))
    discard_damaged_arrow_cache(Path(cache_dir) / "corpus")
    documents = corpus_documents(corpus, cache_dir, num_proc=num_proc)
    if corpus.source != "local" and isinstance(documents, datasets.Dataset):
        for directory in {Path(f["filename"]).parent for f in documents.cache_files}:
            discard_damaged_arrow_cache(directory, maps_only=True)
    return documents


def stage(job: DataSettings, name: str):
    """One of STAGES: one line at its end; datasets' bars of its maps with progress_bars=true
    only."""
    return preprocessing_stage(name, library_bars=job.library_bars,
                               log=logger)


def _size(dataset) -> int | None:
    return len(dataset) if isinstance(dataset, datasets.Dataset) else None  # a stream: unknown


def split_corpus(job: DataSettings):
    """(training documents, held-out documents or None): the corpus split by heldout.fraction,
    as every pretraining run (and a benchmark scoring another model alike) splits it."""
    with stage(job, READING) as made:
        documents = pretraining_documents(job.corpus, job.cache_dir,
                                          job.preprocessing_num_workers)
        made.count, made.unit = _size(documents), "documents"
    heldout = job.heldout
    if isinstance(documents, datasets.Dataset):  # a stream's size is not known ahead
        check_corpus_size(len(documents), job.objective, heldout.fraction)
    with stage(job, HOLDING_OUT) as made:
        train, held = split_documents(documents, heldout.fraction, heldout.min_documents,
                                      num_proc=job.preprocessing_num_workers)
        made.count = 0 if held is None else len(held)
        made.unit = f"documents held out (heldout.fraction={heldout.fraction})"
    if held is not None:
        check_training_share(len(train), len(held), job.objective, heldout.fraction)
    return train, held


def pretraining_tokenizer(training: DictConfig, model: DictConfig, corpus: DictConfig,
                          cache_dir: str, documents) -> PreTrainedTokenizerBase:
    """The configured WordPiece vocabulary (model.tokenizer), or one trained on this corpus (and
    cached) by the tokenizer_training node (`training`)."""
    if not training.enabled:
        return load_tokenizer(model, job="pretraining")
    settings = {"vocab_size": training.vocab_size, "min_frequency": training.min_frequency,
                "lowercase": training.lowercase}
    directory = trained_tokenizer_dir(cache_dir, _corpus_fingerprint(corpus, documents),
                                      **settings)

    def sentences():
        for batch in documents.iter(batch_size=1000):
            for document in batch["sentences"]:
                yield from document

    return ensure_trained_tokenizer(sentences, directory, **settings)


def phase_settings(pretraining: DictConfig, masking: DictConfig) -> list[tuple[int, int, float]]:
    """(max_seq_length, max_predictions_per_seq, share of steps) per phase."""
    long_phase = pretraining.long_phase
    phases = [(pretraining.max_seq_length, masking.max_predictions_per_seq,
               1.0 - long_phase.fraction)]
    if long_phase.fraction > 0:
        phases.append((long_phase.max_seq_length, long_phase.max_predictions_per_seq,
                       long_phase.fraction))
    return phases


def _rule(masking: DictConfig, max_predictions: int):
    return masking_rule_from_config(
        OmegaConf.merge(masking, {"max_predictions_per_seq": max_predictions}))


def build_training_data(job: DataSettings, documents, tokenizer: PreTrainedTokenizerBase,
                        args: TrainingArguments):
    """(train dataset, phases for the sampler or None when streaming, collator, the
    padding-free batches' plan or None)."""
    num_proc = job.preprocessing_num_workers
    pad_to = job.pad_to_multiple_of if (args.bf16 or args.fp16) else None
    settings = phase_settings(job.pretraining, job.masking)
    static = job.masking.kind == "static"
    # Batches at their phase's length where static shapes pay (bertkit.training.run).
    widths = job.static_shapes

    def collator(shapes=None):  # shapes: padding-free batches' (PackShape per phase)
        if static:
            return StaticMasksCollator(
                tokenizer, [(length, predictions) for length, predictions, _ in settings],
                pad_to, static=widths, packed=shapes)
        return DynamicMaskingCollator(
            tokenizer,
            [(length, _rule(job.masking, predictions)) for length, predictions, _ in settings],
            pad_to_multiple_of=pad_to, static=widths, packed=shapes)

    if is_streaming(job.corpus):  # padding-free needs stored instances: padded batches
        with stage(job, TOKENIZING) as made:  # lazily: as training reads the stream
            tokenized = tokenize_documents(documents, tokenizer)
            made.unit = "(a stream: tokenized as training reads it)"
        stream = streaming_instances(
            tokenized, tokenizer, objective=job.objective.name,
            max_seq_length=job.pretraining.max_seq_length,
            short_seq_prob=job.pretraining.short_seq_prob, seed=job.seed,
            buffer_documents=job.pretraining.streaming_buffer_documents)
        return stream.remove_columns(["length"]), None, collator(), None

    with stage(job, TOKENIZING) as made:
        tokenized = tokenize_documents(documents, tokenizer, num_proc=num_proc)
        made.count, made.unit = len(tokenized), "documents"
    with stage(job, INSTANCES) as made:
        parts, phases = _phase_instances(job, tokenized, tokenizer, args, static)
        made.count = sum(len(part) for part in parts)
        made.unit = (f"instances in {len(parts)} phase(s)"
                     + (", statically masked" if static else ""))
    packing = None
    if padding_free_wanted(job.pretraining.padding_free, job.model.attention_probs_dropout_prob):
        shapes = pack_shapes([(length, predictions, float(np.mean(phase.lengths)))
                              for phase, (length, predictions, _) in zip(phases, settings,
                                                                          strict=True)],
                             args.per_device_train_batch_size,
                             job.pretraining.sequence_slot_headroom)
        packing = PackingPlan(shapes, [
            most_predictions(phase.lengths, _rule(job.masking, predictions))
            for phase, (_, predictions, _) in zip(phases, settings, strict=True)])
    return (datasets.concatenate_datasets(parts), phases,
            collator(None if packing is None else packing.shapes), packing)


def _phase_instances(job: DataSettings, tokenized: datasets.Dataset,
                     tokenizer: PreTrainedTokenizerBase, args: TrainingArguments,
                     static: bool) -> tuple[list[datasets.Dataset], list[Phase]]:
    """Each phase's instances (masked when static) and its Phase for the sampler."""
    num_proc = job.preprocessing_num_workers
    settings = phase_settings(job.pretraining, job.masking)
    vocab = Vocabulary.from_tokenizer(tokenizer)
    objective = objective_of(job.objective)
    # Pairs: each duplicate cuts the documents anew (as Google's dupe_factor does); packed
    # sequences are cut one way, and the duplicates differ by their masks only.
    cut_anew = objective.cuts_each_copy
    dupe_factor = job.masking.dupe_factor if static else 1
    samples_per_step = (args.per_device_train_batch_size * args.gradient_accumulation_steps
                        * args.world_size)
    steps = phase_steps(args.max_steps, job.pretraining.long_phase.fraction)
    parts, phases, offset = [], [], 0
    for (length, predictions, _), phase_step_count in zip(settings, steps, strict=False):
        instances = objective.instances(
            tokenized, tokenizer, max_seq_length=length,
            short_seq_prob=job.pretraining.short_seq_prob, seed=job.seed,
            copies=dupe_factor if cut_anew else 1, num_proc=num_proc)
        if static:
            instances = static_masked_copies(
                instances, vocab, _rule(job.masking, predictions), seed=job.seed, num_proc=num_proc,
                dupe_factor=1 if cut_anew else dupe_factor)
        if len(instances) == 0:
            raise BertkitError(f"corpus {job.corpus.name}: no training instance of up to "
                               f"{length} tokens could be built (is the corpus empty?)")
        lengths = np.asarray(instances.with_format("numpy")["length"])
        phases.append(Phase(offset, lengths, phase_step_count * samples_per_step))
        parts.append(instances)
        offset += len(instances)
    return parts, phases
