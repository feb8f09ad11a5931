"""The pretraining job, read top-down in `pretrain`: BertForPreTraining trained from raw
documents with Trainer, one stage a function below it, in the order the job calls them:

1. the settings checked, before any data is read (with the downstream finetunes' sizes);
2. the run started (bertkit.training.run.start_run: TrainingArguments, the checkpoint to resume,
   the seed);
3. the data, built once per run: the corpus's documents (bertkit.pretraining.corpora), a share
   held out first (heldout.fraction; bertkit.pretraining.heldout), the WordPiece vocabulary
   from the rest, then instances per phase (bertkit.pretraining.objective and .instances:
   sentence pairs for NSP/SOP, packed full sentences for MLM alone) with static masks stored on
   disk or a collator that draws dynamic masks (bertkit.pretraining.masking). Every step runs
   through datasets.map and is cached by fingerprint, so a rerun or a sweep job reuses it;
4. the model (bertkit.pretraining.model) and PretrainingTrainer (bertkit.pretraining.trainer);
5. training (bertkit.training.run.train_run: the callbacks, W&B, trainer.train), scored during
   training on held-out masked positions that are the same for every arm of a comparison;
6. the model saved, metrics.json, the model card, W&B's summary and the printout (publish);
7. the downstream finetunes: GLUE finetunes of the checkpoint right after pretraining, in the
   same job. An ablation of pretraining (static vs dynamic masking, NSP or not) is judged
   downstream; run as one job, each sweep point carries its own downstream scores into
   metrics.json. They are composed from the same config tree as `bertkit recipe=glue`, so they
   use that recipe's defaults plus downstream.overrides.

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

from bertkit.config_schema import check_ranges
from bertkit.config_tree import compose_config, debug_overrides
from bertkit.data.atomic_files import discard_damaged_arrow_cache, write_json_atomic
from bertkit.data.cache import model_input_fingerprints
from bertkit.data.metrics_file import (
    INPUT_FINGERPRINTS,
    LIMITED_SAMPLES,
    METRICS_FILE,
    cut,
    cut_line,
    describe_cut,
    limited_samples,
)
from bertkit.data.task_data import known_offline
from bertkit.errors import BertkitError
from bertkit.pretraining.batches import (
    PackingPlan,
    Phase,
    pack_shapes,
    padding_free_wanted,
    phase_steps,
)
from bertkit.pretraining.corpora import (
    corpus_documents,
    corpus_input_fingerprints,
    ensure_demo_corpus,
)
from bertkit.pretraining.heldout import (
    HeldoutEvaluation,
    HeldoutSet,
    build_heldout,
    check_corpus_size,
    check_heldout_config,
    check_training_share,
    heldout_enabled,
    heldout_record,
    split_documents,
)
from bertkit.pretraining.masking import (
    DynamicMaskingCollator,
    StaticMasksCollator,
    Vocabulary,
    masking_rule_from_config,
    most_predictions,
    static_masked_copies,
)
from bertkit.pretraining.model import load_pretraining_model, use_padding_free_attention
from bertkit.pretraining.objective import objective_of, streaming_instances, tokenize_documents
from bertkit.pretraining.trainer import PretrainingTrainer
from bertkit.pretraining.wordpiece import ensure_trained_tokenizer, trained_tokenizer_dir
from bertkit.secret_masking import mask_secrets
from bertkit.tasks import task_family
from bertkit.training.finetune import finetune
from bertkit.training.model_card import run_card, write_card
from bertkit.training.models import check_model_settings, load_tokenizer, tokenizer_size
from bertkit.training.run import (
    Outcome,
    RunSetup,
    TrainingRun,
    every_bar_shown,
    preprocessing_stage,
    publish,
    push_if_asked,
    saving_model,
    start_run,
    train_run,
)
from bertkit.training.stop_and_resume import TrainingClock
from bertkit.training.trainer import prepare_compile, static_shapes_pay
from bertkit.training.wandb_logging import paper_hyperparameters

logger = logging.getLogger(__name__)

# The choices of masking.kind (bertkit.config_schema reads them).
MASKING_KINDS = ("static", "dynamic")

# The stages of the data preparation, in order: each prints one line when it ends (its count
# and time) in place of datasets' bars for each of its maps (bertkit.training.run).
READING, HOLDING_OUT, VOCABULARY, TOKENIZING, INSTANCES, HELDOUT_SET = STAGES = (
    "pretraining data 1/6, reading the corpus",
    "pretraining data 2/6, holding out documents",
    "pretraining data 3/6, the vocabulary",
    "pretraining data 4/6, tokenizing the documents",
    "pretraining data 5/6, building the training instances",
    "pretraining data 6/6, building the held-out set",
)


def pretrain(cfg: DictConfig, run_dir: Path | None = None) -> dict:
    """Pretrains from cfg.corpus; returns the metrics.json record (with the downstream
    finetunes' scores when downstream.tasks is set)."""
    check_pretraining_config(cfg)
    setup = start_run(cfg, run_dir)
    data, inputs = prepare_data(cfg, setup)
    trainer, hyperparameters = build_pretraining_trainer(cfg, setup.args, data)
    limited = pretraining_cuts(cfg.corpus, data)
    run = train_run(cfg, setup, trainer, hyperparameters,
                    heldout_callbacks(cfg.heldout, trainer, data, setup.clock), limited)
    save_model(trainer, setup.run_dir, run.main)
    outcome = _outcome(cfg, trainer, data, run, setup.run_dir, inputs, limited)
    publish(setup, run, outcome)
    record = _downstream(cfg, setup.cfg, outcome.record, setup.run_dir, run.main)
    push_if_asked(setup, trainer, record)
    return record


# The checks


def check_pretraining_config(cfg: DictConfig) -> None:
    """Contradictory settings fail here, before any data is read: each value's type and range
    first (the schema, bertkit.config_schema), then the rules between settings."""
    check_ranges(cfg)
    objective = objective_of(cfg.objective)  # a registered objective, its keys its own
    # -1 (train by epochs) is a valid trainer.max_steps elsewhere, not for pretraining.
    if cfg.trainer.max_steps is None or cfg.trainer.max_steps <= 0:
        raise BertkitError("trainer.max_steps: pretraining is measured in optimizer steps "
                           "(the paper: 1,000,000); give a positive number")
    long_phase = cfg.pretraining.long_phase
    lengths = {"pretraining.max_seq_length": cfg.pretraining.max_seq_length}
    if long_phase.fraction > 0:
        lengths["pretraining.long_phase.max_seq_length"] = long_phase.max_seq_length
    # A vocabulary trained by the run is not there yet: load_pretraining_model checks it.
    check_model_settings(
        cfg.model, lengths,
        f"objective.name={objective.name} ({objective.title})" if objective.second_segment
        else None, None if cfg.tokenizer_training.enabled else tokenizer_size(cfg.model))
    if long_phase.fraction > 0 and long_phase.max_seq_length <= cfg.pretraining.max_seq_length:
        raise BertkitError(f"pretraining.max_seq_length={cfg.pretraining.max_seq_length} is not "
                           f"below pretraining.long_phase.max_seq_length="
                           f"{long_phase.max_seq_length} (the last "
                           f"pretraining.long_phase.fraction={long_phase.fraction} of the steps): "
                           f"lower it, raise the long phase's, or set "
                           f"pretraining.long_phase.fraction=0")
    # the GLUE finetunes after it, against the same model.config
    check_downstream(cfg)
    check_heldout_config(cfg.heldout)
    if is_streaming(cfg.corpus):
        if cfg.masking.kind == "static":
            raise BertkitError("masking=static with corpus.hub.streaming=true: static masks are "
                               "computed once and stored, which a stream cannot do; use "
                               "masking=dynamic, or corpus.hub.streaming=false")
        if long_phase.fraction > 0:
            raise BertkitError("pretraining.long_phase.fraction>0 with corpus.hub.streaming=true: "
                               "the 512-token phase needs its own stored instances; set "
                               "pretraining.long_phase.fraction=0 or corpus.hub.streaming=false")
        if cfg.pretraining.padding_free is True:
            raise BertkitError("pretraining.padding_free=true with corpus.hub.streaming=true: "
                               "padding-free batches are drawn from the stored instances of "
                               "each phase, which a stream does not have; set "
                               "pretraining.padding_free=auto or false, or "
                               "corpus.hub.streaming=false")
        if heldout_enabled(cfg.heldout):
            raise BertkitError("heldout.fraction>0 with corpus.hub.streaming=true: the held-out "
                               "documents are chosen from the stored corpus before training, "
                               "which a stream cannot do; set heldout.fraction=0 or "
                               "corpus.hub.streaming=false")


def check_downstream(cfg: DictConfig) -> None:
    """The pretrained model's sizes against each downstream task, before pretraining starts
    (a task longer than its positions, or of sentence pairs on one token type, would fail
    only once the pretraining's hours are spent)."""
    if not cfg.downstream.tasks:
        return
    for task, task_cfg in downstream_configs(cfg, Path("pretrained-model")).items():
        at = f"downstream.tasks.{task}'s"
        segment = task_family(task_cfg.task.family).second_segment(task_cfg.task,
                                                                    task_cfg.data_source)
        check_model_settings(cfg.model, {f"{at} task.max_seq_length":
                                         task_cfg.task.max_seq_length},
                             f"{at} {segment}" if segment else None, None)


# The data


def prepare_data(cfg: DictConfig, setup: RunSetup) -> tuple[PretrainingData, dict]:
    """The vocabulary, instances and held-out sets (the main process first, the others read
    its cache), and what the run read by content: bertkit-report tells its downstream
    finetunes apart by these, not by the paths they were given (bertkit.reporting.identity).
    Compiled, the compile caches go under cache_dir first, shared with other runs."""
    if setup.args.torch_compile:
        prepare_compile(setup.cfg.cache_dir)
    with setup.args.main_process_first(desc="preparing the pretraining data"):
        data = prepare_pretraining_data(cfg, setup.args)
        inputs = {**model_input_fingerprints(cfg.model, data.tokenizer, cfg.cache_dir),
                  **corpus_input_fingerprints(cfg.corpus, cfg.cache_dir)}
    return data, inputs


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
    # Padding-free batches (bertkit.pretraining.batches), or None: padded ones, grouped
    # by length or not (bertkit.pretraining.batches).
    packing: PackingPlan | None = None
    group_by_length: bool = True


def prepare_pretraining_data(cfg: DictConfig, args: TrainingArguments) -> PretrainingData:
    """Built from the pretraining job's config (corpus, model, tokenizer_training,
    pretraining, masking, objective, heldout and the job's top-level keys)."""
    started = time.perf_counter()
    # Held-out documents never reach the vocabulary nor the training data.
    documents, heldout_docs = split_corpus(cfg)
    with stage(cfg, VOCABULARY) as made:
        tokenizer = pretraining_tokenizer(cfg.tokenizer_training, cfg.model, cfg.corpus,
                                          cfg.cache_dir, documents)
        made.count, made.unit = len(tokenizer), "tokens" + (
            "" if cfg.tokenizer_training.enabled else f" ({cfg.model.tokenizer}, as given)")
    train_dataset, phases, collator, packing = build_training_data(cfg, documents, tokenizer,
                                                                   args)
    heldout = None
    if heldout_docs is not None:
        with stage(cfg, HELDOUT_SET) as made:
            heldout = build_heldout(cfg.heldout, cfg.pretraining, cfg.objective,
                                    tokenizer, heldout_docs)
            made.count = len(heldout.mlm) + (0 if heldout.pairs is None else len(heldout.pairs))
            made.unit = "sequences"
    train_documents = len(documents) if isinstance(documents, datasets.Dataset) else None
    return PretrainingData(tokenizer, train_dataset, phases, collator,
                           time.perf_counter() - started, heldout, train_documents, packing,
                           group_by_length=not static_shapes(cfg))


def static_shapes(cfg: DictConfig) -> bool:
    """Batches at their phase's length (bertkit.training.trainer.static_shapes_pay)."""
    return static_shapes_pay(cfg)


def stage(cfg: DictConfig, name: str):
    """One of STAGES: one line at its end; datasets' bars of its maps with progress_bars=true
    only."""
    return preprocessing_stage(name, library_bars=every_bar_shown(cfg.progress_bars),
                               log=logger)


def split_corpus(cfg: DictConfig):
    """(training documents, held-out documents or None): the corpus split by heldout.fraction,
    as every pretraining run (and a benchmark scoring another model alike) splits it."""
    with stage(cfg, READING) as made:
        documents = pretraining_documents(cfg.corpus, cfg.cache_dir,
                                          cfg.preprocessing_num_workers)
        made.count, made.unit = _size(documents), "documents"
    heldout = cfg.heldout
    if isinstance(documents, datasets.Dataset):  # a stream's size is not known ahead
        check_corpus_size(len(documents), cfg.objective, heldout.fraction)
    with stage(cfg, HOLDING_OUT) as made:
        train, held = split_documents(documents, heldout.fraction, heldout.min_documents,
                                      num_proc=cfg.preprocessing_num_workers)
        made.count = 0 if held is None else len(held)
        made.unit = f"documents held out (heldout.fraction={heldout.fraction})"
    if held is not None:
        check_training_share(len(train), len(held), cfg.objective, heldout.fraction)
    return train, held


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


def _size(dataset) -> int | None:
    return len(dataset) if isinstance(dataset, datasets.Dataset) else None  # a stream: unknown


def is_streaming(corpus: DictConfig) -> bool:
    return corpus.source == "hub" and corpus.hub.streaming


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


def _corpus_fingerprint(corpus: DictConfig, documents) -> str:
    """The dataset's own fingerprint; a stream has none, so its settings stand in for it."""
    if isinstance(documents, datasets.Dataset):
        return documents._fingerprint
    return hashlib.sha256(OmegaConf.to_yaml(corpus, resolve=True).encode()).hexdigest()[:16]


def build_training_data(cfg: DictConfig, documents, tokenizer: PreTrainedTokenizerBase,
                        args: TrainingArguments):
    """(train dataset, phases for the sampler or None when streaming, collator, the
    padding-free batches' plan or None)."""
    num_proc = cfg.preprocessing_num_workers
    pad_to = cfg.pad_to_multiple_of if (args.bf16 or args.fp16) else None
    settings = phase_settings(cfg.pretraining, cfg.masking)
    static = cfg.masking.kind == "static"
    # Batches at their phase's length where static shapes pay (bertkit.training.run).
    widths = static_shapes(cfg)

    def collator(shapes=None):  # shapes: padding-free batches' (PackShape per phase)
        if static:
            return StaticMasksCollator(
                tokenizer, [(length, predictions) for length, predictions, _ in settings],
                pad_to, static=widths, packed=shapes)
        return DynamicMaskingCollator(
            tokenizer,
            [(length, _rule(cfg.masking, predictions)) for length, predictions, _ in settings],
            pad_to_multiple_of=pad_to, static=widths, packed=shapes)

    if is_streaming(cfg.corpus):  # padding-free needs stored instances: padded batches
        with stage(cfg, TOKENIZING) as made:  # lazily: as training reads the stream
            tokenized = tokenize_documents(documents, tokenizer)
            made.unit = "(a stream: tokenized as training reads it)"
        stream = streaming_instances(
            tokenized, tokenizer, objective=cfg.objective.name,
            max_seq_length=cfg.pretraining.max_seq_length,
            short_seq_prob=cfg.pretraining.short_seq_prob, seed=cfg.seed,
            buffer_documents=cfg.pretraining.streaming_buffer_documents)
        return stream.remove_columns(["length"]), None, collator(), None

    with stage(cfg, TOKENIZING) as made:
        tokenized = tokenize_documents(documents, tokenizer, num_proc=num_proc)
        made.count, made.unit = len(tokenized), "documents"
    with stage(cfg, INSTANCES) as made:
        parts, phases = _phase_instances(cfg, tokenized, tokenizer, args, static)
        made.count = sum(len(part) for part in parts)
        made.unit = (f"instances in {len(parts)} phase(s)"
                     + (", statically masked" if static else ""))
    packing = None
    if padding_free_wanted(cfg.pretraining.padding_free, cfg.model.attention_probs_dropout_prob):
        shapes = pack_shapes([(length, predictions, float(np.mean(phase.lengths)))
                              for phase, (length, predictions, _) in zip(phases, settings,
                                                                          strict=True)],
                             args.per_device_train_batch_size,
                             cfg.pretraining.sequence_slot_headroom)
        packing = PackingPlan(shapes, [
            most_predictions(phase.lengths, _rule(cfg.masking, predictions))
            for phase, (_, predictions, _) in zip(phases, settings, strict=True)])
    return (datasets.concatenate_datasets(parts), phases,
            collator(None if packing is None else packing.shapes), packing)


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


def _phase_instances(cfg: DictConfig, tokenized: datasets.Dataset,
                     tokenizer: PreTrainedTokenizerBase, args: TrainingArguments,
                     static: bool) -> tuple[list[datasets.Dataset], list[Phase]]:
    """Each phase's instances (masked when static) and its Phase for the sampler."""
    num_proc = cfg.preprocessing_num_workers
    settings = phase_settings(cfg.pretraining, cfg.masking)
    vocab = Vocabulary.from_tokenizer(tokenizer)
    objective = objective_of(cfg.objective)
    # Pairs: each duplicate cuts the documents anew (as Google's dupe_factor does); packed
    # sequences are cut one way, and the duplicates differ by their masks only.
    cut_anew = objective.cuts_each_copy
    dupe_factor = cfg.masking.dupe_factor if static else 1
    samples_per_step = (args.per_device_train_batch_size * args.gradient_accumulation_steps
                        * args.world_size)
    steps = phase_steps(args.max_steps, cfg.pretraining.long_phase.fraction)
    parts, phases, offset = [], [], 0
    for (length, predictions, _), phase_step_count in zip(settings, steps, strict=False):
        instances = objective.instances(
            tokenized, tokenizer, max_seq_length=length,
            short_seq_prob=cfg.pretraining.short_seq_prob, seed=cfg.seed,
            copies=dupe_factor if cut_anew else 1, num_proc=num_proc)
        if static:
            instances = static_masked_copies(
                instances, vocab, _rule(cfg.masking, predictions), seed=cfg.seed, num_proc=num_proc,
                dupe_factor=1 if cut_anew else dupe_factor)
        if len(instances) == 0:
            raise BertkitError(f"corpus {cfg.corpus.name}: no training instance of up to "
                               f"{length} tokens could be built (is the corpus empty?)")
        lengths = np.asarray(instances.with_format("numpy")["length"])
        phases.append(Phase(offset, lengths, phase_step_count * samples_per_step))
        parts.append(instances)
        offset += len(instances)
    return parts, phases


# The model and the Trainer


def build_pretraining_trainer(cfg: DictConfig, args: TrainingArguments,
                              data: PretrainingData) -> tuple[PretrainingTrainer, dict]:
    """(the trainer, the hyperparameters recorded in W&B and metrics.json)."""
    model = load_pretraining_model(cfg.model, data.tokenizer,
                                   cfg.pretraining.pad_vocab_to_multiple_of)
    if data.packing is not None:
        use_padding_free_attention(model)
    trainer = PretrainingTrainer(
        model=model, args=args, train_dataset=data.train_dataset,
        data_collator=data.collator, processing_class=data.tokenizer,
        phases=data.phases, sentence_task=objective_of(cfg.objective).sentence_task,
        group_by_length=data.group_by_length, packing=data.packing)
    return trainer, pretraining_hyperparameters(cfg.pretraining, cfg.masking, cfg.objective,
                                                cfg.corpus, args, model)


def pretraining_hyperparameters(pretraining: DictConfig, masking: DictConfig,
                                objective: DictConfig, corpus: DictConfig,
                                args: TrainingArguments, model) -> dict:
    """The paper's names plus what defines a pretraining run, for W&B and metrics.json."""
    long_phase = pretraining.long_phase
    return {
        **paper_hyperparameters(args, model, pretraining.max_seq_length),
        "objective": objective.name,
        "masking": masking.kind,
        "dupe_factor": masking.dupe_factor if masking.kind == "static" else None,
        "mlm_probability": masking.mlm_probability,
        "mask_token_fraction": masking.mask_token_fraction,
        "random_token_fraction": masking.random_token_fraction,
        "max_predictions_per_seq": masking.max_predictions_per_seq,
        "masking_unit": masking.unit,
        "masking_convention": masking.convention,
        "short_seq_prob": pretraining.short_seq_prob,
        "long_phase_fraction": long_phase.fraction,
        "long_phase_max_seq_length": long_phase.max_seq_length if long_phase.fraction else None,
        "corpus": corpus.name,
        "vocab_size": model.vocab_rows,  # as saved: without the padding rows
        "pad_vocab_to_multiple_of": pretraining.pad_vocab_to_multiple_of,
    }


def heldout_callbacks(settings: DictConfig, trainer, data: PretrainingData,
                      clock: TrainingClock) -> list:
    """The held-out evaluation, on the run's training clock (paused while it scores);
    settings: the heldout node."""
    if data.heldout is None:
        return []
    return [HeldoutEvaluation(trainer, data.heldout, clock, batch_size=settings.batch_size,
                              every_seconds=settings.every_seconds,
                              every_steps=settings.every_steps)]


def pretraining_cuts(corpus: DictConfig, data: PretrainingData) -> dict[str, dict]:
    """The parts of the data a pretraining run cut (bertkit.data.metrics_file): the corpus,
    when reading stopped at corpus.max_documents (the documents read; the whole is not
    counted). A corpus with fewer documents was read whole: no cut. heldout.max_sequences is
    not a cut: it is the size of the held-out sample every arm is scored on (512 by
    default), a setting that splits the report's rows like any other."""
    limit = corpus.max_documents
    if limit is None:
        return {}
    read = (limit if data.train_documents is None  # a stream stops at the limit
            else data.train_documents + (data.heldout.documents if data.heldout else 0))
    return {"corpus": cut(read, None)} if read >= limit else {}


# The saved model and the record


def save_model(trainer: PretrainingTrainer, run_dir: Path, main: bool) -> None:
    """The trained model under run_dir/model (BertForPreTraining's files, without the
    vocabulary's padding rows)."""
    with saving_model(run_dir / "model", main):
        trainer.save_model(str(run_dir / "model"))


def _outcome(cfg: DictConfig, trainer, data: PretrainingData, run: TrainingRun,
             run_dir: Path, inputs: dict[str, str], limited: dict[str, dict]) -> Outcome:
    lines = _training_lines(trainer.state.log_history)
    phases = data.phases
    record = {
        "recipe": cfg.recipe.name,
        "family": "pretraining",
        "corpus": cfg.corpus.name,
        "objective": cfg.objective.name,
        "masking": cfg.masking.kind,
        "seed": trainer.args.seed,
        # The share of the positions fed in training that were padding (across resumes).
        "padding_fraction": trainer.padding_fraction,
        "padding_free": data.packing is not None,
        "first_log": lines[0] if lines else {},
        "last_log": lines[-1] if lines else {},
        "train": run.train_record(tokens_seen=trainer.state.num_input_tokens_seen),
        "data": {
            "instances": None if phases is None else [
                {"max_seq_length": length, "instances": len(phase.lengths),
                 "mean_length": float(np.mean(phase.lengths)) if len(phase.lengths) else 0.0,
                 "samples": phase.num_samples}
                for (length, _, _), phase in zip(phase_settings(cfg.pretraining, cfg.masking),
                                                 phases, strict=False)],
            "preprocessing_seconds": round(data.seconds, 2),
        },
        "hyperparameters": run.hyperparameters,
        "heldout": None if data.heldout is None else heldout_record(
            data.heldout, data.train_documents, trainer.state.log_history,
            cfg.heldout),
        "log": lines,  # every training log line, for curves without W&B
        "details": {INPUT_FINGERPRINTS: inputs,
                    **({LIMITED_SAMPLES: limited} if limited else {})},
    }
    last = record["last_log"]
    heldout_final = (record["heldout"] or {}).get("final") or {}

    window = trainer.last_logging_window

    def printout(where: str) -> str:
        sentence = objective_of(cfg.objective).sentence_task
        scores = f"MLM loss {last.get('mlm_loss', float('nan')):.4f}, MLM accuracy " \
                 f"{last.get('mlm_accuracy', float('nan')):.4f}"
        if sentence:
            scores += (f", {sentence.upper()} accuracy "
                       f"{last.get(f'{sentence}_accuracy', 0.0):.4f}")
        model_dir = run_dir / "model"
        return (f"\npretraining on {cfg.corpus.name}: {scores} "
                f"{_window_words(window)}, after {run.output.global_step} steps\n"
                f"{_heldout_line(record['heldout'], sentence)}"
                f"{cut_line(limited, cfg.corpus.name)}"
                f"  metrics:  {run_dir / METRICS_FILE}\n"
                f"  model:    {model_dir}\n"
                f"  finetune: bertkit recipe=glue task=mrpc model.name_or_path={model_dir}"
                # without the Hub, MRPC's files are needed (bertkit.data.task_data)
                + (" task.data_dir=<MRPC's files>" if known_offline() else ""))

    final = {**last, **{f"heldout/{key}": value for key, value in heldout_final.items()
                        if key != "step"}}
    return Outcome(record, final, None, printout)


def _training_lines(history: list[dict]) -> list[dict]:
    return [dict(line) for line in history if "mlm_loss" in line]


def _window_words(window: tuple[int, int] | None) -> str:
    """Which steps the printed training scores are the mean of (the last log line's)."""
    if window is None:
        return "(no training step logged)"
    first, last = window
    return f"(step {last})" if first == last else f"(mean over steps {first}-{last})"


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


# The downstream finetunes


def _downstream(cfg: DictConfig, card: DictConfig, record: dict, run_dir: Path,
                main: bool) -> dict:
    """The downstream finetunes, once the pretraining W&B run is closed (they open their
    own), on every process (a finetune under torchrun needs all of them); their scores go
    into metrics.json and the model's card."""
    if not cfg.downstream.tasks:
        return record
    downstream = finetune_downstream(cfg, run_dir / "model", run_dir)
    if not main:
        return record
    record = {**record, "downstream": downstream}
    write_json_atomic(run_dir / METRICS_FILE, mask_secrets(record))
    write_card(run_card(card, record), run_dir / "model")
    for task, result in downstream.items():
        cuts = result.get(LIMITED_SAMPLES) or {}
        print(f"  {task}: {result['main_metric']} = {result['main_value']:.4f}"
              + (f" (part of the data only: "
                 f"{'; '.join(describe_cut(part, entry) for part, entry in cuts.items())})"
                 if cuts else ""))
    return record


def finetune_downstream(cfg: DictConfig, model_dir: Path,
                        run_dir: Path) -> dict[str, dict]:
    """{task: {main_metric, main_value, validation, limited_samples when its data was cut}}
    for every downstream task, each run
    through the finetune job like any `bertkit recipe=glue` run."""
    results = {}
    for task, task_cfg in downstream_configs(cfg, model_dir).items():
        summary = finetune(task_cfg, task_family(task_cfg.task.family),
                           run_dir / "downstream" / task)
        results[task] = {key: summary[key] for key in ("main_metric", "main_value",
                                                       "validation")}
        if limited_samples(summary):  # a finetune on part of the data is no result on it
            results[task][LIMITED_SAMPLES] = limited_samples(summary)
    return results


def downstream_configs(cfg: DictConfig, model_dir: Path) -> dict[str, DictConfig]:
    """One GLUE config per task of downstream.tasks ({task: [overrides]}), with the pretraining
    job's seed, logger, cache, checkpoints and debug preset."""
    configs = {}
    shared = [str(o) for o in cfg.downstream.overrides]
    logger = "wandb" if cfg.logger.backend == "wandb" else "none"
    for task, overrides in cfg.downstream.tasks.items():
        try:
            configs[task] = compose_config([
                "recipe=glue", f"task={task}", f"model.name_or_path={model_dir}",
                f"seed={cfg.seed}", f"logger={logger}", f"cache_dir={cfg.cache_dir}",
                f"keep_checkpoints={str(cfg.keep_checkpoints is True).lower()}",
                *debug_overrides(OmegaConf.select(cfg, "debug.preset")), *shared,
                *[str(o) for o in overrides or []]])
        except Exception as err:  # Hydra's composition errors: name the key they came from
            raise BertkitError(f"downstream.tasks.{task}: {err}") from None
    return configs
