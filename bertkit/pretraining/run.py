"""The pretraining family: BertForPreTraining from raw documents with Trainer.

Corpus -> documents of sentences -> WordPiece ids -> instances (sentence pairs for NSP/SOP,
packed full sentences for MLM alone) at each phase's sequence length -> static masks stored
on disk, or dynamic masks drawn in the collator -> PretrainingTrainer. Every step runs
through datasets.map and is cached by fingerprint, so a rerun or a sweep job reuses it.

A share of the documents is held out first (heldout.fraction; bertkit/pretraining/heldout.py):
the vocabulary and the training data come from the rest, and the model is scored during
training on held-out masked positions that are the same for every arm of a comparison.

Leaves in the run directory: config.yaml, metrics.json, and model/ (weights and tokenizer),
which the GLUE recipe finetunes with model.name_or_path=<run dir>/model.
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

from bertkit.data.atomic_files import write_json_atomic
from bertkit.data.metrics_file import METRICS_FILE
from bertkit.errors import BertkitError
from bertkit.pretraining.corpora import corpus_documents
from bertkit.pretraining.demo_corpus import ensure_demo_corpus
from bertkit.pretraining.downstream import finetune_downstream
from bertkit.pretraining.dynamic_masking import DynamicMaskingCollator, padding_collator
from bertkit.pretraining.heldout import (
    HeldoutSet,
    build_heldout,
    check_heldout_config,
    heldout_enabled,
    heldout_settings,
    split_documents,
)
from bertkit.pretraining.heldout_evaluation import HeldoutEvaluation, heldout_record
from bertkit.pretraining.instances import (
    packed_sequences_dataset,
    pair_instances_dataset,
    streaming_instances,
    tokenize_documents,
)
from bertkit.pretraining.masking import Vocabulary, masking_rule_from_config
from bertkit.pretraining.model import load_pretraining_model
from bertkit.pretraining.phases import Phase, phase_steps
from bertkit.pretraining.static_masking import static_masked_copies
from bertkit.pretraining.trainer import PretrainingTrainer
from bertkit.pretraining.wordpiece import ensure_trained_tokenizer, trained_tokenizer_dir
from bertkit.training.clock import TrainingClock
from bertkit.training.models import load_tokenizer
from bertkit.training.run import Outcome, TrainingJob, run_training
from bertkit.training.wandb_logging import paper_hyperparameters

logger = logging.getLogger(__name__)

PACKINGS = ("pairs", "full_sentences")
SENTENCE_TASKS = ("nsp", "sop", None)
MASKING_KINDS = ("static", "dynamic")


def check_pretraining_config(cfg: DictConfig) -> None:
    """Contradictory settings fail here, before any data is read."""
    objective, masking = cfg.objective, cfg.masking
    if objective.packing not in PACKINGS:
        raise BertkitError(f"objective.packing={objective.packing!r}: expected one of "
                           f"{', '.join(PACKINGS)}")
    if objective.sentence_task not in SENTENCE_TASKS:
        raise BertkitError(f"objective.sentence_task={objective.sentence_task!r}: expected "
                           f"nsp, sop or null")
    if (objective.packing == "pairs") != (objective.sentence_task is not None):
        raise BertkitError(f"objective={objective.name}: sentence pairs go with a sentence task "
                           f"(nsp or sop), full-sentence packing with none")
    if masking.kind not in MASKING_KINDS:
        raise BertkitError(f"masking.kind={masking.kind!r}: expected static or dynamic")
    if cfg.trainer.max_steps is None or cfg.trainer.max_steps <= 0:
        raise BertkitError("trainer.max_steps: pretraining is measured in optimizer steps "
                           "(the paper: 1,000,000); give a positive number")
    long_phase = cfg.pretraining.long_phase
    if not 0 <= long_phase.fraction < 1:
        raise BertkitError(f"pretraining.long_phase.fraction={long_phase.fraction}: expected "
                           f"a fraction of the steps in [0, 1)")
    if long_phase.fraction > 0 and long_phase.max_seq_length <= cfg.pretraining.max_seq_length:
        raise BertkitError("pretraining.long_phase.max_seq_length must exceed "
                           "pretraining.max_seq_length")
    longest = max(cfg.pretraining.max_seq_length,
                  long_phase.max_seq_length if long_phase.fraction > 0 else 0)
    positions = OmegaConf.select(cfg.model, "config.max_position_embeddings", default=512)
    if longest > positions:
        raise BertkitError(f"sequences of {longest} tokens do not fit "
                           f"model.config.max_position_embeddings={positions}")
    check_heldout_config(cfg)
    if is_streaming(cfg.corpus):
        if masking.kind == "static":
            raise BertkitError("masking=static with corpus.hub.streaming=true: static masks are "
                               "computed once and stored, which a stream cannot do; use "
                               "masking=dynamic, or corpus.hub.streaming=false")
        if long_phase.fraction > 0:
            raise BertkitError("pretraining.long_phase.fraction>0 with corpus.hub.streaming=true: "
                               "the 512-token phase needs its own stored instances; set "
                               "pretraining.long_phase.fraction=0 or corpus.hub.streaming=false")
        if heldout_enabled(cfg):
            raise BertkitError("heldout.fraction>0 with corpus.hub.streaming=true: the held-out "
                               "documents are chosen from the stored corpus before training, "
                               "which a stream cannot do; set heldout.fraction=0 or "
                               "corpus.hub.streaming=false")


def is_streaming(corpus: DictConfig) -> bool:
    return corpus.source == "hub" and bool(OmegaConf.select(corpus, "hub.streaming"))


def _corpus_fingerprint(corpus: DictConfig, documents) -> str:
    """The dataset's own fingerprint; a stream has none, so its settings stand in for it."""
    if isinstance(documents, datasets.Dataset):
        return documents._fingerprint
    return hashlib.sha256(OmegaConf.to_yaml(corpus, resolve=True).encode()).hexdigest()[:16]


def pretraining_documents(cfg: DictConfig):
    """The corpus's documents (the demo corpus generated first if it is the one)."""
    synthetic = OmegaConf.select(cfg.corpus, "synthetic")
    if synthetic is not None:
        ensure_demo_corpus(Path(cfg.corpus.files[0]), OmegaConf.to_container(synthetic))
    return corpus_documents(cfg.corpus, cfg.cache_dir, num_proc=cfg.preprocessing_num_workers)


def split_corpus(cfg: DictConfig):
    """(training documents, held-out documents or None): the corpus split by heldout.fraction,
    as every pretraining run (and a benchmark scoring another model alike) splits it."""
    documents = pretraining_documents(cfg)
    heldout = heldout_settings(cfg)
    return split_documents(documents, heldout.fraction, heldout.min_documents,
                           num_proc=cfg.preprocessing_num_workers)


def pretraining_tokenizer(cfg: DictConfig, documents) -> PreTrainedTokenizerBase:
    """The configured WordPiece vocabulary, or one trained on this corpus (and cached)."""
    training = cfg.tokenizer_training
    if not training.enabled:
        return load_tokenizer(cfg.model)
    settings = {"vocab_size": training.vocab_size, "min_frequency": training.min_frequency,
                "lowercase": training.lowercase}
    directory = trained_tokenizer_dir(cfg.cache_dir, _corpus_fingerprint(cfg.corpus, documents),
                                      **settings)

    def sentences():
        for batch in documents.iter(batch_size=1000):
            for document in batch["sentences"]:
                yield from document

    return ensure_trained_tokenizer(sentences, directory, **settings)


def _instances(cfg: DictConfig, tokenized, tokenizer, max_seq_length: int, copies: int):
    if cfg.objective.packing == "full_sentences":
        return packed_sequences_dataset(tokenized, tokenizer, max_seq_length=max_seq_length,
                                        num_proc=cfg.preprocessing_num_workers)
    return pair_instances_dataset(
        tokenized, tokenizer, max_seq_length=max_seq_length,
        short_seq_prob=cfg.pretraining.short_seq_prob, seed=cfg.seed, copies=copies,
        num_proc=cfg.preprocessing_num_workers, sentence_task=cfg.objective.sentence_task)


def _phase_settings(cfg: DictConfig) -> list[tuple[int, int, float]]:
    """(max_seq_length, max_predictions_per_seq, share of steps) per phase."""
    long_phase = cfg.pretraining.long_phase
    phases = [(cfg.pretraining.max_seq_length, cfg.masking.max_predictions_per_seq,
               1.0 - long_phase.fraction)]
    if long_phase.fraction > 0:
        phases.append((long_phase.max_seq_length, long_phase.max_predictions_per_seq,
                       long_phase.fraction))
    return phases


def _rule(cfg: DictConfig, max_predictions: int):
    masking = OmegaConf.merge(cfg.masking, {"max_predictions_per_seq": max_predictions})
    return masking_rule_from_config(masking)


def build_training_data(cfg: DictConfig, documents, tokenizer: PreTrainedTokenizerBase,
                        args: TrainingArguments):
    """(train dataset, phases for the sampler or None when streaming, collator)."""
    num_proc = cfg.preprocessing_num_workers
    pad_to = cfg.pad_to_multiple_of if (args.bf16 or args.fp16) else None
    settings = _phase_settings(cfg)
    static = cfg.masking.kind == "static"
    if static:
        collator = padding_collator(tokenizer, pad_to)
    else:
        collator = DynamicMaskingCollator(
            tokenizer, [(length, _rule(cfg, predictions)) for length, predictions, _ in settings],
            pad_to_multiple_of=pad_to)
    if is_streaming(cfg.corpus):
        tokenized = tokenize_documents(documents, tokenizer)
        stream = streaming_instances(
            tokenized, tokenizer, objective=cfg.objective.name,
            max_seq_length=cfg.pretraining.max_seq_length,
            short_seq_prob=cfg.pretraining.short_seq_prob, seed=cfg.seed,
            buffer_documents=cfg.pretraining.streaming_buffer_documents)
        return stream.remove_columns(["length"]), None, collator

    tokenized = tokenize_documents(documents, tokenizer, num_proc=num_proc)
    vocab = Vocabulary.from_tokenizer(tokenizer)
    pairs = cfg.objective.packing == "pairs"
    dupe_factor = cfg.masking.dupe_factor if static else 1
    samples_per_step = (args.per_device_train_batch_size * args.gradient_accumulation_steps
                        * args.world_size)
    steps = phase_steps(args.max_steps, cfg.pretraining.long_phase.fraction)
    parts, phases, offset = [], [], 0
    for (length, predictions, _), phase_step_count in zip(settings, steps, strict=False):
        # Pairs: each duplicate cuts the documents anew (as Google's dupe_factor does);
        # packed sequences are cut one way, and the duplicates differ by their masks only.
        instances = _instances(cfg, tokenized, tokenizer, length,
                               copies=dupe_factor if pairs else 1)
        if static:
            instances = static_masked_copies(
                instances, vocab, _rule(cfg, predictions), seed=cfg.seed, num_proc=num_proc,
                dupe_factor=1 if pairs else dupe_factor)
        if len(instances) == 0:
            raise BertkitError(f"corpus {cfg.corpus.name}: no training instance of up to "
                               f"{length} tokens could be built (is the corpus empty?)")
        lengths = np.asarray(instances.with_format("numpy")["length"])
        phases.append(Phase(offset, lengths, phase_step_count * samples_per_step))
        parts.append(instances)
        offset += len(instances)
    return datasets.concatenate_datasets(parts), phases, collator


def pretraining_hyperparameters(cfg: DictConfig, args: TrainingArguments, model) -> dict:
    """The paper's names plus what defines a pretraining run, for W&B and metrics.json."""
    masking, long_phase = cfg.masking, cfg.pretraining.long_phase
    return {
        **paper_hyperparameters(args, model, cfg.pretraining.max_seq_length),
        "objective": cfg.objective.name,
        "masking": masking.kind,
        "dupe_factor": masking.dupe_factor if masking.kind == "static" else None,
        "mlm_probability": masking.mlm_probability,
        "mask_token_fraction": masking.mask_token_fraction,
        "random_token_fraction": masking.random_token_fraction,
        "max_predictions_per_seq": masking.max_predictions_per_seq,
        "masking_unit": masking.unit,
        "short_seq_prob": cfg.pretraining.short_seq_prob,
        "long_phase_fraction": long_phase.fraction,
        "long_phase_max_seq_length": long_phase.max_seq_length if long_phase.fraction else None,
        "corpus": cfg.corpus.name,
        "vocab_size": model.config.vocab_size,
    }


def _heldout_line(heldout: dict | None, sentence_task: str | None) -> str:
    """The printout's held-out scores (at the last evaluation), or nothing when off."""
    final = (heldout or {}).get("final")
    if not final:
        return ""
    line = (f"  held-out ({heldout['sequences']} sequences, {heldout['masked_positions']} masked "
            f"positions): MLM loss {final['mlm_loss']:.4f}, MLM accuracy "
            f"{final['mlm_accuracy']:.4f}")
    if sentence_task and f"{sentence_task}_accuracy" in final:
        line += f", {sentence_task.upper()} accuracy {final[f'{sentence_task}_accuracy']:.4f}"
    return line + "\n"


def _training_lines(history: list[dict]) -> list[dict]:
    return [dict(line) for line in history if "mlm_loss" in line]


@dataclass
class _Prepared:
    tokenizer: PreTrainedTokenizerBase
    train_dataset: object
    phases: list[Phase] | None
    collator: object
    seconds: float
    heldout: HeldoutSet | None = None  # None: heldout.fraction=0
    train_documents: int | None = None  # None: a stream


class PretrainingJob(TrainingJob):
    preparing = "preparing the pretraining data"

    def check(self, cfg):
        check_pretraining_config(cfg)

    def prepare_data(self, cfg, args) -> _Prepared:
        started = time.perf_counter()
        # Held-out documents never reach the vocabulary nor the training data.
        documents, heldout_docs = split_corpus(cfg)
        tokenizer = pretraining_tokenizer(cfg, documents)
        train_dataset, phases, collator = build_training_data(cfg, documents, tokenizer, args)
        heldout = None if heldout_docs is None else build_heldout(cfg, tokenizer, heldout_docs)
        train_documents = len(documents) if isinstance(documents, datasets.Dataset) else None
        return _Prepared(tokenizer, train_dataset, phases, collator,
                         time.perf_counter() - started, heldout, train_documents)

    def build_trainer(self, cfg, args, prepared, pad_to_multiple_of):
        model = load_pretraining_model(cfg.model, prepared.tokenizer)
        trainer = PretrainingTrainer(
            model=model, args=args, train_dataset=prepared.train_dataset,
            data_collator=prepared.collator, processing_class=prepared.tokenizer,
            phases=prepared.phases, sentence_task=cfg.objective.sentence_task)
        return trainer, pretraining_hyperparameters(cfg, args, model)

    def callbacks(self, cfg, trainer, prepared, clock: TrainingClock) -> list:
        """The held-out evaluation, on the run's training clock."""
        if prepared.heldout is None:
            return []
        settings = heldout_settings(cfg)
        return [HeldoutEvaluation(trainer, prepared.heldout, clock,
                                  batch_size=settings.batch_size,
                                  every_seconds=settings.every_seconds,
                                  every_steps=settings.every_steps)]

    def outcome(self, cfg, trainer, prepared, run, run_dir: Path, hyperparameters) -> Outcome:
        trainer.save_model(str(run_dir / "model"))
        lines = _training_lines(trainer.state.log_history)
        phases = prepared.phases
        record = {
            "recipe": cfg.recipe.name,
            "family": "pretraining",
            "corpus": cfg.corpus.name,
            "objective": cfg.objective.name,
            "masking": cfg.masking.kind,
            "seed": trainer.args.seed,
            "first_log": lines[0] if lines else {},
            "last_log": lines[-1] if lines else {},
            "train": run.train_record(tokens_seen=trainer.state.num_input_tokens_seen),
            "data": {
                "instances": None if phases is None else [
                    {"max_seq_length": length, "instances": len(phase.lengths),
                     "mean_length": float(np.mean(phase.lengths)) if len(phase.lengths)
                     else 0.0,
                     "samples": phase.num_samples}
                    for (length, _, _), phase in zip(_phase_settings(cfg), phases,
                                                     strict=False)],
                "preprocessing_seconds": round(prepared.seconds, 2),
            },
            "hyperparameters": hyperparameters,
            "heldout": None if prepared.heldout is None else heldout_record(
                prepared.heldout, prepared.train_documents, trainer.state.log_history,
                heldout_settings(cfg)),
            "log": lines,  # every training log line, for curves without W&B
        }
        last = record["last_log"]
        heldout_final = (record["heldout"] or {}).get("final") or {}

        def printout(where: str) -> str:
            sentence = cfg.objective.sentence_task
            scores = f"MLM loss {last.get('mlm_loss', float('nan')):.4f}, MLM accuracy " \
                     f"{last.get('mlm_accuracy', float('nan')):.4f}"
            if sentence:
                scores += (f", {sentence.upper()} accuracy "
                           f"{last.get(f'{sentence}_accuracy', 0.0):.4f}")
            model_dir = run_dir / "model"
            return (f"\npretraining on {cfg.corpus.name}: {scores} after "
                    f"{run.output.global_step} steps\n"
                    f"{_heldout_line(record['heldout'], sentence)}"
                    f"  metrics:  {run_dir / METRICS_FILE}\n"
                    f"  model:    {model_dir}\n"
                    f"  finetune: bertkit recipe=glue task=mrpc model.name_or_path={model_dir}")

        final = {**last, **{f"heldout/{key}": value for key, value in heldout_final.items()
                            if key != "step"}}
        return Outcome(record, final, None, printout)

    def after(self, cfg, record, run_dir: Path, main: bool) -> dict:
        """The downstream finetunes, once the pretraining W&B run is closed (they open their
        own), on every process (a finetune under torchrun needs all of them)."""
        if not cfg.downstream.tasks:
            return record
        downstream = finetune_downstream(cfg, run_dir / "model", run_dir)
        if not main:
            return record
        record = {**record, "downstream": downstream}
        write_json_atomic(run_dir / METRICS_FILE, record)
        for task, result in downstream.items():
            print(f"  {task}: {result['main_metric']} = {result['main_value']:.4f}")
        return record


def pretrain(cfg: DictConfig, run_dir: Path | None = None) -> dict:
    return run_training(cfg, PretrainingJob(), run_dir)
