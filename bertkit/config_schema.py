"""Typed schemas of the config, so that a bad value is refused at the edge, naming the key.

The trainer group's schema is in Hydra's ConfigStore (as the halving sweeper's), outside the
group (trainer_schema: never one of the group's choices): its YAML files list it first in
`defaults`, so OmegaConf refuses a value of the wrong type at composition. Its defaults are
TrainingArguments' own, so a key a YAML leaves out behaves as if it were not given. Nodes that
recipes and task families extend with keys of their own (the root, task, budget) cannot be
closed that way: their schemas (SETTINGS) name the keys every run shares, without defaults
(the values are the YAML's alone), and check_ranges holds the composed values to them, type
by OmegaConf, once, as the job starts (run_job).
What a type cannot say is in each field's metadata: its range, written as an interval
("[1, inf)", "(0, 1]") and stored as min, above, max, below; choices (a tuple, or "module:NAME"
of the tuple where the code that reads the key keeps it); integer (a field of type Any that
must be a whole number when it is a number); `expect`, the message's wording; `reads`, a path
to a file or folder a run reads (input_keys: what bertkit-report compares by content). Every
number a user can type has both ends declared, inf saying that side is genuinely unbounded (a
batch size; stored as None), so that a key whose range nobody thought about cannot pass for
one that has none (tests/test_config_bounds.py walks every composed config for such a key).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import importlib
import operator
import types
import typing
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, ListConfig, OmegaConf, ValidationError
from transformers import TrainingArguments

from bertkit.errors import BertkitError

_ARGUMENTS = {f.name: f for f in dataclasses.fields(TrainingArguments)}
# An unbounded integer is still held to 64 bits, what torch and numpy can hold
# (torch.empty(10**30): "Overflow when unpacking").
INT64 = 2**63
SEED = f"[0, {2**32 - 1}]"  # numpy's and torch's seeds (numpy refuses any other)
SHARE, PROBABILITY = "[0, 1]", "[0, 1)"  # a share; a dropout or a share below 1
COUNT = "[1, inf)"  # a positive integer, as large as memory allows
# A learning rate: above 1 no optimizer bertkit offers trains, and 2e5 is a typo of 2e-5.
LEARNING_RATE = "(0, 1]"


def _bounds(interval: str | None = None, expect: str | None = None, **metadata) -> dict:
    """A field's metadata: its range ("[0, 1)": min 0, below 1; a bracket holds its end, a
    parenthesis leaves it out, inf is a side without a limit), what the message says is
    expected, and any other (choices, each, integer, reads)."""
    if interval:
        low, high = (end.strip() for end in interval[1:-1].split(","))
        metadata = {("min" if interval[0] == "[" or low == "-inf" else "above"): _end(low),
                    ("max" if interval[-1] == "]" or high == "inf" else "below"): _end(high),
                    **metadata}
    return {**metadata, **({"expect": expect} if expect else {})}


def _setting(interval: str | None = None, expect: str | None = None, **metadata) -> Any:
    """A schema field with _bounds' metadata. No default: the values are the YAML's (a
    trainer field's, TrainingArguments' own)."""
    return field(metadata=_bounds(interval, expect, **metadata))


def _end(end: str) -> int | float | None:
    return None if end.lstrip("+-") == "inf" else float(end) if "." in end else int(end)


def _training_arguments(schema: type) -> type:
    """The dataclass of `schema`, each field's default TrainingArguments' own."""
    for name in schema.__annotations__:
        spec = schema.__dict__.get(name)
        setattr(schema, name, field(default=_ARGUMENTS[name].default,
                                    metadata=spec.metadata if spec is not None else {}))
    return dataclass(schema)


@_training_arguments
class TrainerSchema:
    """The trainer group (conf/trainer/): TrainingArguments by their own names, those that
    bertkit's YAML files set. Any other TrainingArguments key can still be added with
    +trainer.NAME=VALUE on a command line; a YAML that sets one must add it here."""

    learning_rate: float = _setting(LEARNING_RATE)
    per_device_train_batch_size: int = _setting(COUNT)
    per_device_eval_batch_size: int = _setting(COUNT)
    gradient_accumulation_steps: int = _setting(COUNT)
    # Any, checked as a number by check_ranges: 2 stays 2 in sweep directory names (ep2).
    num_train_epochs: Any = _setting("(0, inf)")
    max_steps: int = _setting("[-1, inf)")  # -1: train by epochs
    warmup_steps: float = _setting("[0, inf)")  # below 1: a share of all steps
    lr_scheduler_type: str = _setting(choices="transformers.trainer_utils:SchedulerType")
    weight_decay: float = _setting("[0, inf)")
    adam_beta1: float = _setting(PROBABILITY)
    adam_beta2: float = _setting(PROBABILITY)
    adam_epsilon: float = _setting("(0, inf)")
    max_grad_norm: float = _setting("[0, inf)")
    optim: str = _setting(choices="transformers.training_args:OptimizerNames")
    seed: int = _setting(SEED)
    train_sampling_strategy: str = _setting(choices=tuple(
        _ARGUMENTS["train_sampling_strategy"].metadata.get("choices", ())) or None)
    eval_strategy: str = _setting(choices="transformers.trainer_utils:IntervalStrategy")
    eval_steps: float | None = _setting("(0, inf)")
    save_strategy: str = _setting(choices="transformers.trainer_utils:SaveStrategy")
    save_steps: float = _setting("(0, inf)")
    save_total_limit: int | None = _setting(COUNT)
    metric_for_best_model: str | None
    load_best_model_at_end: bool
    logging_strategy: str = _setting(choices="transformers.trainer_utils:IntervalStrategy")
    logging_steps: float = _setting("(0, inf)")
    logging_first_step: bool
    # auto or a number of worker processes (bertkit.training.run checks it).
    dataloader_num_workers: Any = _setting("[0, inf)", choices=("auto",))
    dataloader_persistent_workers: bool
    dataloader_prefetch_factor: int | None = _setting(COUNT)
    include_num_input_tokens_seen: Any
    # auto (finetuning's default): compiled on a GPU for runs of compile_min_steps or more
    # (bertkit.training.static_shapes.decide_compile); true or false as given.
    torch_compile: Any = _setting(choices=("auto", True, False))
    torch_compile_mode: str | None = _setting(
        choices="bertkit.training.static_shapes:COMPILE_MODES")
    ddp_find_unused_parameters: bool | None
    disable_tqdm: bool | None
    push_to_hub: bool
    hub_model_id: str | None


@dataclass
class RunSchema:
    """The root keys of conf/config.yaml that every run shares."""

    seed: int = _setting(SEED, "an integer in [0, 2**32 - 1] (numpy's and torch's seeds)")
    pad_to_multiple_of: int | None = _setting(COUNT)
    preprocessing_num_workers: int | None = _setting(COUNT)
    gpu_dataloader_workers: int = _setting("[0, inf)")
    agree_every_steps: int = _setting(COUNT, "a positive number of optimizer steps")
    fsync_checkpoints: bool
    keep_checkpoints: bool
    overwrite: bool
    bucket_width: int = _setting(COUNT, "a positive number of tokens (1: no buckets)")
    buckets_on_cpu: bool
    compile_min_steps: int = _setting("[0, inf)", "a number of optimizer steps, 0 or more")
    train_fraction: float | None = _setting("(0, 1]",
                                            "a number in (0, 1], or null for the whole schedule")
    mixed_precision: str = _setting(choices="bertkit.training.arguments:PRECISIONS")
    data_source: str = _setting(choices="bertkit.data.task_data:DATA_SOURCES")
    hub_check_seconds: float = _setting("(0, inf)", "a positive number of seconds")
    # auto, true or false (bertkit.training.progress)
    progress_bars: Any = _setting(choices="bertkit.training.progress:PROGRESS_BARS")


@dataclass
class TaskSchema:
    """The keys of conf/task/ that every task family reads; a family checks its own."""

    name: str
    family: str
    # [CLS], one token and [SEP]; a family may need more (SWAG: two segments).
    # Above: the model's position embeddings (checked against the model when it is known).
    max_seq_length: int = _setting("[3, inf)", "an integer of at least 3")
    main_metric: str
    # A family's own keys, checked where a task has them: SQuAD's windows and answers, the
    # learning rate and epochs a task conf suggests, NER's tag scheme.
    doc_stride: int = _setting(COUNT)
    max_query_length: int = _setting(COUNT)
    max_answer_length: int = _setting(COUNT)
    n_best_size: int = _setting(COUNT)
    # SQuAD 2.0's no-answer margin: a score difference, either sign.
    null_score_diff_threshold: float = _setting("(-inf, inf)")
    learning_rate: float = _setting(LEARNING_RATE)
    num_train_epochs: float = _setting("(0, inf)")
    tag_scheme: str = _setting(choices="bertkit.tasks.ner.files:TAG_SCHEMES")
    # Local data (a family's reader says which files it needs); null: the Hub's.
    data_dir: str | None = _setting(reads="folder")
    train_file: str | None = _setting(reads="file")
    validation_file: str | None = _setting(reads="file")
    test_file: str | None = _setting(reads="file")
    # STS-B's [low, high]: any scores (a file's labels outside it are refused).
    label_range: list[float] | None = _setting("(-inf, inf)", each=True)
    # The first N examples of the training, dev and test splits (bertkit.data.task_data:
    # first_examples), before tokenisation; null: all.
    max_train_samples: int | None = _setting(COUNT, "null (all) or a positive integer")
    max_eval_samples: int | None = _setting(COUNT, "null (all) or a positive integer")
    max_predict_samples: int | None = _setting(COUNT, "null (all) or a positive integer")


DECAYS = ("linear", "cosine", "constant")  # the learning rate's shape after warm-up


@dataclass
class BudgetSchema:
    """budget.* (bertkit.training.budget): training to a time budget."""

    minutes: float | None = _setting("(0, inf)",
                                     "a positive number of minutes of training, or null (off)")
    warmup_fraction: float = _setting("[0, 1)", "a share of the budget's time in [0, 1)")
    decay: str = _setting(choices=DECAYS)
    min_lr_ratio: float = _setting("[0, 1]", "a share of the peak learning rate in [0, 1]")


@dataclass
class EarlyStoppingSchema:
    patience: int | None = _setting(
        COUNT, "a positive integer (or null to turn early stopping off)")
    threshold: float = _setting("[0, inf)")


@dataclass
class BertConfigSchema:
    """model.config (a model trained from scratch: BertConfig's keys) and bench.model."""

    vocab_size: int = _setting(COUNT)
    hidden_size: int = _setting(COUNT)
    num_hidden_layers: int = _setting(COUNT)
    num_attention_heads: int = _setting(COUNT)
    intermediate_size: int = _setting(COUNT)
    max_position_embeddings: int = _setting(COUNT)
    type_vocab_size: int = _setting(COUNT)
    hidden_dropout_prob: float = _setting(PROBABILITY)
    attention_probs_dropout_prob: float = _setting(PROBABILITY)
    attn_implementation: str = _setting(choices="bertkit.training.models:CHOICES")
    hidden_act: str = _setting(choices="transformers.activations:ACT2FN")


@dataclass
class ModelSchema:
    """conf/model/: a checkpoint (or null: trained from scratch, sizes in config), its
    tokenizer, dropout, attention kernel, and whether code shipped with them may run."""

    # A Hub id or a directory; bertkit.training.models says which is missing.
    name_or_path: str | None = _setting(reads="folder")
    tokenizer: str | None = _setting(reads="folder")
    do_lower_case: bool
    hidden_dropout_prob: float = _setting(PROBABILITY)
    attention_probs_dropout_prob: float = _setting(PROBABILITY)
    attn_implementation: str = _setting(choices="bertkit.training.models:CHOICES")
    # Whether code a checkpoint or tokenizer folder ships (its auto_map) may run.
    trust_remote_code: bool


@dataclass
class ModelFetchSchema:
    """model.fetch: where a preset's local files go and the command that gets them."""

    directory: str
    command: str


@dataclass
class FeatureBasedSchema:
    """model.feature_based (NER's feature-based tagger)."""

    enabled: bool
    dropout: float = _setting(PROBABILITY)
    lstm_hidden_size: int = _setting(COUNT)
    lstm_layers: int = _setting(COUNT)
    layers: str = _setting(choices="bertkit.tasks.ner.feature_based_tagger:LAYER_COMBINATIONS")
    classifier: str = _setting(choices="bertkit.tasks.ner.feature_based_tagger:CLASSIFIERS")


@dataclass
class FinetuningSchema:
    """conf/finetuning/ (BERTology's methods)."""

    freeze_layers: int = _setting("[0, inf)")  # above: the model's layers
    reinit_layers: int = _setting("[0, inf)")  # above: the model's layers
    reinit_pooler: bool
    bitfit: bool  # only in conf/finetuning/bitfit.yaml
    head_lr_multiplier: float = _setting("(0, inf)")
    # Each layer down: x this; 1: all alike; never above 1 (lower layers faster).
    layer_lr_decay: float = _setting("(0, 1]")
    # epoch, or a whole number of optimizer steps.
    unfreeze_every: Any = _setting(COUNT, "epoch, a number of optimizer steps >= 1, or null (off)",
                                   choices=("epoch",), integer=True)
    pooling: str = _setting(choices="bertkit.finetuning.methods:POOLING")


@dataclass
class LoraSchema:
    r: int = _setting(COUNT)
    alpha: float = _setting("(0, inf)")
    dropout: float = _setting(PROBABILITY)


@dataclass
class R3FSchema:
    eps: float = _setting("(0, inf)")
    weight: float = _setting("[0, inf)")
    noise: str = _setting(choices="bertkit.finetuning.methods:NOISE")


@dataclass
class MaskingSchema:
    """masking.* and heldout.masking.* (bertkit.pretraining.masking)."""

    kind: str = _setting(choices="bertkit.pretraining.run:MASKING_KINDS")
    unit: str = _setting(choices="bertkit.pretraining.masking:UNITS")
    convention: str = _setting(choices="bertkit.pretraining.masking:CONVENTIONS")
    mlm_probability: float = _setting("(0, 1)")
    mask_token_fraction: float = _setting(SHARE)
    random_token_fraction: float = _setting(SHARE)
    max_predictions_per_seq: int = _setting(COUNT)
    span_geometric_p: float = _setting("(0, 1]")
    span_max_words: int = _setting(COUNT)
    dupe_factor: int = _setting(COUNT)


@dataclass
class ObjectiveSchema:
    """objective.*: the registered objectives' values (bertkit.pretraining.objective)."""

    name: str = _setting(choices="bertkit.pretraining.objective:NAMES")
    packing: str = _setting(choices="bertkit.pretraining.objective:PACKINGS")
    sentence_task: str | None = _setting(choices="bertkit.pretraining.objective:SENTENCE_TASKS")


@dataclass
class PretrainingSchema:
    # [CLS] and [SEP] around at least one token; above: the model's position embeddings.
    max_seq_length: int = _setting("[3, inf)")
    short_seq_prob: float = _setting(SHARE)
    streaming_buffer_documents: int = _setting(COUNT)
    # Vocabulary rows rounded up to a multiple of this (1: not padded); a power of two past
    # 1024 rows is no tensor-core shape anyone needs.
    pad_vocab_to_multiple_of: int = _setting("[1, 1024]",
                                             "a positive number of rows (1: no padding), at most "
                                             "1024")
    # auto, true or false (bertkit.pretraining.padding_free)
    padding_free: Any = _setting(choices="bertkit.pretraining.padding_free:SETTINGS")
    # A padding-free batch's sequence slots over those its mean instance needs: at least 1.
    sequence_slot_headroom: float = _setting("[1, inf)")


@dataclass
class LongPhaseSchema:
    fraction: float = _setting("[0, 1)", "a fraction of the steps in [0, 1)")
    max_seq_length: int = _setting("[3, inf)")
    max_predictions_per_seq: int = _setting(COUNT)


@dataclass
class HeldoutSchema:
    """heldout.* (bertkit.pretraining.heldout): the held-out documents and their evaluation."""

    fraction: float = _setting("[0, 1)", "a share of the documents in [0, 1) (0: no held-out set)")
    max_sequences: int = _setting(COUNT)
    batch_size: int = _setting(COUNT)
    min_documents: int = _setting(COUNT)
    seed: int = _setting(SEED)
    every_seconds: float | None = _setting("(0, inf)")
    every_steps: int | None = _setting(COUNT)


@dataclass
class CorpusSchema:
    name: str
    source: str = _setting(choices=("local", "hub"))
    # Local files only (null for a Hub corpus); corpus.parts' own formats are checked where
    # they are read (bertkit.pretraining.corpora), a list's items being out of a schema's reach.
    format: str | None = _setting(choices="bertkit.pretraining.corpus_formats:FORMATS")
    # A list of files or glob patterns (or one), and parts: [{format, files}]; whether the files
    # exist is checked when they are read.
    files: Any = _setting(reads="files")
    parts: Any = _setting(reads="files")  # [{format, files}]
    max_documents: int | None = _setting(COUNT, "null (all) or a positive integer")


@dataclass
class CorpusHubSchema:
    path: str | None
    name: str | None
    split: str
    text_column: str
    streaming: bool
    rows_per_document: int = _setting(COUNT)


@dataclass
class SyntheticSchema:
    """corpus.synthetic and task.synthetic: the generated demo data's sizes."""

    num_documents: int = _setting(COUNT)
    num_topics: int = _setting(COUNT)
    min_sentences: int = _setting(COUNT)
    max_sentences: int = _setting(COUNT)
    min_words: int = _setting(COUNT)
    max_words: int = _setting(COUNT)
    num_train: int = _setting(COUNT)
    num_validation: int = _setting(COUNT)
    num_test: int = _setting("[0, inf)")
    seed: int = _setting(SEED)


@dataclass
class ConllColumnsSchema:
    """task.columns of a CoNLL file (NER): how many, and which holds the token and the tag
    (0-based). GLUE's task.columns name header columns instead, and are not numbers."""

    count: int = _setting(COUNT)
    token: int = _setting("[0, inf)")
    tag: int = _setting("[0, inf)")


@dataclass
class HeaderlessColumnsSchema:
    """task.headerless_columns: 0-based positions in a GLUE file without a header (CoLA)."""

    label: int = _setting("[0, inf)")
    text_a: int = _setting("[0, inf)")
    text_b: int | None = _setting("[0, inf)")


@dataclass
class TokenizerTrainingSchema:
    vocab_size: int = _setting(COUNT)
    min_frequency: int = _setting(COUNT)


@dataclass
class BenchSchema:
    """bench.* of the benchmark recipes."""

    steps: int = _setting(COUNT)
    warmup_steps: int = _setting("[0, inf)")
    steady_skip: int = _setting("[0, inf)")
    repeats: int = _setting(COUNT)
    sync_steps: int = _setting("[2, inf)", "at least 2 (the last step logs, and is not counted)")
    batch_size: int = _setting(COUNT)
    baseline_max_length: int = _setting("[3, inf)")
    eval_instances: int = _setting(COUNT)
    instances: int = _setting(COUNT)  # bench_masking
    mlm_probability: float = _setting("(0, 1)")
    num_proc: int | None = _setting(COUNT)  # null: in the main process
    num_threads: int | None = _setting(COUNT)


@dataclass
class BenchWorkloadSchema:
    """bench.glue, bench.pretraining and bench.pretraining_packed (bench_step's synthetic
    batches)."""

    batch_size: int = _setting(COUNT)
    batches: int = _setting(COUNT)
    seq_length: int = _setting("[3, inf)")
    min_length: int = _setting("[3, inf)")
    padded_share: float = _setting(PROBABILITY)
    num_labels: int = _setting(COUNT)
    mlm_slots: int = _setting(COUNT)
    mlm_used: int = _setting(COUNT)
    # pretraining_packed's: pretraining.sequence_slot_headroom's bounds
    sequence_slot_headroom: float = _setting("[1, inf)")


@dataclass
class BenchPlainSchema:
    """bench.plain: the plain Hugging Face pretraining bench_pretrain_quality compares with."""

    batch_size: int = _setting(COUNT)
    warmup_ratio: float = _setting(PROBABILITY)
    weight_decay: float = _setting("[0, inf)")
    dropout: float = _setting(PROBABILITY)
    mlm_probability: float = _setting("(0, 1)")
    timing_steps: int = _setting(COUNT)
    learning_rates: list[float] = _setting(LEARNING_RATE, each=True)
    logging_steps: int = _setting(COUNT)


@dataclass
class ParitySchema:
    baseline_max_length: int = _setting("[3, inf)")
    alpha: float = _setting("(0, 1)")
    max_difference: float = _setting("[0, inf)")
    seeds: list[int] = _setting(SEED, "seeds in [0, 2**32 - 1]", each=True)


@dataclass
class BenchSweepSchema:
    n_jobs: int = _setting(COUNT)
    seeds: list[int] = _setting(SEED, "seeds in [0, 2**32 - 1]", each=True)


@dataclass
class BenchGridSchema:
    learning_rates: list[float] = _setting(LEARNING_RATE, each=True)
    seeds: list[int] = _setting(SEED, "seeds in [0, 2**32 - 1]", each=True)
    jobs_per_gpu: int = _setting(COUNT)
    baseline_max_length: int = _setting("[3, inf)")


@dataclass
class PeakTflopsSchema:
    """throughput.peak_tflops.<GPU>: a card's dense peak by precision (MFU's denominator)."""

    bf16: float = _setting("(0, inf)")
    fp16: float = _setting("(0, inf)")
    fp32: float = _setting("(0, inf)")
    tf32: float = _setting("(0, inf)")


# group -> its schema, stored outside every group as <group>_schema (a YAML of the group lists
# `/<group>_schema@_here_` first): in the group it would be offered as one of its choices by
# `bertkit --help` and tab completion (trainer=schema), and it is no setting a user picks.
SCHEMAS = {"trainer": TrainerSchema}
# node -> the schema of the keys it must hold to (the root: ""); checked, not composed.
# A `*` in a path stands for every key of that node (each GPU of throughput.peak_tflops).
SETTINGS = {
    "": RunSchema, "task": TaskSchema, "budget": BudgetSchema,
    "early_stopping": EarlyStoppingSchema, "task.columns": ConllColumnsSchema,
    "task.headerless_columns": HeaderlessColumnsSchema, "task.synthetic": SyntheticSchema,
    "model": ModelSchema, "model.config": BertConfigSchema, "model.fetch": ModelFetchSchema,
    "model.feature_based": FeatureBasedSchema, "finetuning": FinetuningSchema,
    "finetuning.lora": LoraSchema, "finetuning.r3f": R3FSchema, "objective": ObjectiveSchema,
    "masking": MaskingSchema, "pretraining": PretrainingSchema,
    "pretraining.long_phase": LongPhaseSchema, "heldout": HeldoutSchema,
    "heldout.masking": MaskingSchema, "corpus": CorpusSchema, "corpus.hub": CorpusHubSchema,
    "corpus.synthetic": SyntheticSchema, "tokenizer_training": TokenizerTrainingSchema,
    "bench": BenchSchema, "bench.model": BertConfigSchema, "bench.glue": BenchWorkloadSchema,
    "bench.pretraining": BenchWorkloadSchema, "bench.pretraining_packed": BenchWorkloadSchema,
    "bench.plain": BenchPlainSchema, "parity": ParitySchema, "bench_sweep": BenchSweepSchema,
    "bench_grid": BenchGridSchema, "throughput.peak_tflops.*": PeakTflopsSchema}


def register_schemas() -> None:
    store = ConfigStore.instance()
    for group, schema in SCHEMAS.items():
        store.store(name=f"{group}_schema", node=schema)


def choices_of(bounds) -> tuple | None:
    """A field's choices: a tuple, or "module:NAME" of a tuple, dict, Enum or other iterable
    (a registry's names) kept by the code that reads the key (imported when a value is
    checked, so the lists are never copied)."""
    choices = bounds.get("choices")
    if isinstance(choices, str):
        module, name = choices.split(":")
        found = getattr(importlib.import_module(module), name)
        choices = tuple(_choice(item) for item in found)
    return choices


def _choice(item):
    """An enum's member as a config holds it: its value when that is a word (transformers'
    SchedulerType), else its name (OmegaConf reads an Enum field by name)."""
    if not isinstance(item, enum.Enum):
        return item
    return item.value if isinstance(item.value, str) else item.name


def numeric_bounds(bounds) -> dict:
    """The numeric bounds a field declares (min, above, max, below), None (unbounded) kept."""
    return {key: bounds[key] for key in ("min", "above", "max", "below") if key in bounds}


def _is_choice(value, choices: tuple) -> bool:
    """The value is one of the choices as typed: 1 is not true, nor 0 false (Python's
    1 == True would take either for the other)."""
    return any(value == choice and isinstance(value, bool) == isinstance(choice, bool)
               for choice in choices)


def spelled(choice) -> str:
    """A choice as a user types it, on the command line or in YAML: true, false, null."""
    if isinstance(choice, bool):
        return str(choice).lower()
    return "null" if choice is None else str(choice)


_SIGNS = {"min": ">=", "above": ">", "max": "<=", "below": "<"}
_BROKEN = {"min": operator.lt, "above": operator.le, "max": operator.gt, "below": operator.ge}


def _out_of_range(value, bounds) -> str | None:
    """What the value breaks, as "expected ..."; None when it is within bounds."""
    if value is None or not bounds:
        return None
    value = _choice(value)  # an enum default (Optuna's Direction.minimize) as its word
    choices = choices_of(bounds)
    numeric = {key: bound for key, bound in numeric_bounds(bounds).items() if bound is not None}
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if choices is not None and _is_choice(value, choices):
        return None
    if choices is not None and not (numeric and is_number):
        words = ", ".join(spelled(choice) for choice in choices)
        return f"expected one of {words}" + (" or a number" if numeric else "")
    if not numeric:
        return None
    if not is_number:
        return "expected a number"
    if bounds.get("integer") and not isinstance(value, int):  # a field of type Any
        return "expected an integer"
    if isinstance(value, int) and not -INT64 <= value < INT64:  # torch's and numpy's sizes
        return "expected a 64-bit integer (at most 2**63 - 1)"
    if not any(_BROKEN[key](value, bound) for key, bound in numeric.items()):
        return None
    if numeric == {"above": 0}:
        return "expected a positive number"
    return "expected a number " + " and ".join(f"{_SIGNS[key]} {bound}"
                                               for key, bound in numeric.items())


# A field's type name -> the words a message says and the Python types that hold it as is.
_TYPES = {"int": ("an integer", (int,)), "float": ("a number", (int, float)),
          "str": ("a string", (str,)), "bool": ("true or false", (bool,)),
          "None": ("null", (type(None),)), "list": ("a list", (list, ListConfig)),
          "dict": ("a mapping", (dict, DictConfig))}
_TYPE_NAMES = {type(None): "None", list: "list", dict: "dict", typing.Any: "Any"}


def _type_names(spec: dataclasses.Field) -> list[str]:
    """"int | None" -> [int, None]: from the annotation's text (bertkit's schemas), or from
    the type itself (a Hydra plugin's dataclass, Optional[List[int]] -> [list, None])."""
    if isinstance(spec.type, str):
        return [name.strip() for name in spec.type.split("|")]
    union = typing.get_origin(spec.type) in (typing.Union, types.UnionType)
    return [_TYPE_NAMES.get(typing.get_origin(kind) or kind, getattr(kind, "__name__", str(kind)))
            for kind in (typing.get_args(spec.type) if union else (spec.type,))]


def expected_type(spec: dataclasses.Field) -> str:
    """"expected an integer or null" for a field of type int | None."""
    return "expected " + " or ".join(_TYPES[name][0] if name in _TYPES else name
                                     for name in _type_names(spec))


@functools.cache
def _structured(schema: type) -> DictConfig:
    return OmegaConf.structured(schema)


def _wrong_type(schema: type, spec: dataclasses.Field, value) -> bool:
    """The value is not of the field's type. One of the type as it stands (an int for
    int | None) passes without OmegaConf's merge (the common case); a bool field takes only
    true and false (OmegaConf would convert 'yes', 'no' or 1, but the code reads the value as
    it stands, where any word is true, 'no' too); else OmegaConf says (a word for an int)."""
    names = _type_names(spec)
    if all(name in _TYPES for name in names) and (
            "bool" in names if isinstance(value, bool)
            else any(isinstance(value, _TYPES[name][1]) for name in names)):
        return False
    if set(names) <= {"bool", "None"}:
        return True
    try:
        OmegaConf.merge(_structured(schema), {spec.name: value})
    except (ValidationError, ValueError):
        return True
    return False


def _refuse(setting: str, spec: dataclasses.Field | dict, problem: str) -> None:
    """The one line for a refused value: `setting` (key=value) and the field's own wording of
    what is expected (its metadata's), or `problem`."""
    metadata = spec if isinstance(spec, dict) else spec.metadata
    expect = metadata.get("expect")
    raise BertkitError(f"{setting}: " + (f"expected {expect}" if expect else problem))


def _check_each(key: str, value, spec: dataclasses.Field) -> None:
    """A list of numbers (metadata each=True): every item held to the field's bounds, named
    by its index (parity.seeds[1]=-1)."""
    if value is None and "None" in str(spec.type):
        return
    if not isinstance(value, (ListConfig, list)):
        raise BertkitError(f"{key}={value!r}: expected a list of numbers")
    integers = str(spec.type).startswith("list[int]")
    for index, item in enumerate(value):
        problem = _out_of_range(item, spec.metadata)
        if problem is None and (isinstance(item, bool)
                                or not isinstance(item, int if integers else (int, float))):
            problem = "expected an integer" if integers else "expected a number"
        if problem:
            _refuse(f"{key}[{index}]={item!r}", spec, problem)


def _check_node(path: str, node: DictConfig, schema: type, typed: bool) -> None:
    """`typed`: OmegaConf checked the types at composition already (a ConfigStore schema)."""
    for spec in dataclasses.fields(schema):
        if spec.name not in node:
            continue
        key, value = f"{path}.{spec.name}" if path else spec.name, node.get(spec.name)
        if spec.metadata.get("each"):
            _check_each(key, value, spec)
            continue
        problem = _out_of_range(value, spec.metadata)
        if problem is None and not typed and _wrong_type(schema, spec, value):
            problem = expected_type(spec)
        if problem:
            _refuse(f"{key}={value!r}{_set_by(node, spec.name)}", spec, problem)


def _set_by(node: DictConfig, name: str) -> str:
    """ (set by ${bench.batch_size})" for a value interpolated from the key the user typed."""
    if not OmegaConf.is_interpolation(node, name):
        return ""
    return f" (set by {node._get_node(name)._value()})"


def nodes(cfg: DictConfig, path: str):
    """(path, node) of each node a SETTINGS path names in cfg, a `*` standing for every key."""
    found = [("", cfg)]
    for part in path.split(".") if path else []:
        found = [(f"{at}.{key}" if at else str(key), node.get(key))
                 for at, node in found for key in (node.keys() if part == "*" else [part])
                 if key in node and isinstance(node.get(key), DictConfig)]
    return found


# The config run_job checked as the job started (checked_once): not checked again by the job.
_CHECKED: ContextVar[DictConfig | None] = ContextVar("bertkit_checked_config", default=None)


def check_ranges(cfg: DictConfig) -> None:
    """The config's values held to their schemas, before a job starts: the composed groups'
    ranges (their types were checked at composition), and the SETTINGS nodes' types and
    ranges; as done, for the config checked_once checked (finetune's, pretrain's own call)."""
    if cfg is _CHECKED.get():
        return
    for path, schema in SETTINGS.items():  # first: the trainer group interpolates the root's
        for at, node in nodes(cfg, path):
            _check_node(at, node, schema, typed=False)
    for group, schema in SCHEMAS.items():
        node = OmegaConf.select(cfg, group)
        if node is not None:
            _check_node(group, node, schema, typed=True)


@contextmanager
def checked_once(cfg: DictConfig):
    """check_ranges(cfg) at the job's entry (run_job), not again while the job runs."""
    check_ranges(cfg)
    token = _CHECKED.set(cfg)
    try:
        yield cfg
    finally:
        _CHECKED.reset(token)


def check_setting(key: str, value) -> None:
    """One value held to its schema field's range and choices, in check_ranges' one line:
    for code that is handed the value itself, not the composed config (a corpus part's format,
    a function a notebook calls)."""
    spec = schema_field(key)
    problem = _out_of_range(value, spec.metadata)
    if problem:
        _refuse(f"{key}={value!r}", spec, problem)


def input_keys() -> tuple[str, ...]:
    """Every key that names a file or folder a run reads (metadata `reads`), e.g.
    model.tokenizer: what a run's identity compares by content (bertkit.reporting.identity)."""
    return tuple(f"{path}.{spec.name}" if path else spec.name
                 for path, schema in SETTINGS.items() for spec in dataclasses.fields(schema)
                 if spec.metadata.get("reads"))


def schema_field(key: str) -> dataclasses.Field | None:
    """The schema's field of a config key (e.g. throughput.peak_tflops.H100.bf16), if any."""
    parent, _, name = key.rpartition(".")
    parts = parent.split(".") if parent else []
    for path, schema in {**SETTINGS, **SCHEMAS}.items():
        pattern = path.split(".") if path else []
        if len(pattern) == len(parts) and all(p in ("*", q)
                                              for p, q in zip(pattern, parts, strict=True)):
            spec = next((s for s in dataclasses.fields(schema) if s.name == name), None)
            if spec is not None:
                return spec
    return None


# ================================================================================================
# A multirun's launcher and sweeper (hydra.launcher, hydra.sweeper and the nodes inside them:
# Optuna's sampler, gpu_pack's memory). Each Hydra plugin describes its parameters in the
# dataclass it registers in ConfigStore, whose types OmegaConf checks as Hydra composes. Their
# ranges and choices, held here before Hydra instantiates the plugin (bertkit.cli.LaunchCheck;
# the plugin's own check ends in Hydra's "Error in call to target" lines): bertkit's plugins
# (hydra_plugins/) declare them in their fields' metadata, as _bounds' (an "interval" text:
# their modules stay light, Hydra imports them at every start of any app); the plugins that
# bertkit's presets pick (conf/hydra/launcher/, conf/sweep/) and Hydra's basic sweeper, here,
# by their dataclass ("module:Class", for it and its subclasses) and field.
LAUNCH_NODES = ("hydra.launcher", "hydra.sweeper")
_SUBMITIT = "hydra_plugins.hydra_submitit_launcher.config"
_OPTUNA = "hydra_plugins.hydra_optuna_sweeper.config"
PLUGIN_SETTINGS: dict[str, dict[str, dict]] = {
    "hydra._internal.core_plugins.basic_sweeper:BasicSweeperConf": {
        "max_batch_size": _bounds(COUNT, "null (every job in one batch) or a positive "
                                         "number of jobs")},
    "hydra_plugins.hydra_joblib_launcher.config:JobLibLauncherConf": {
        # joblib: -1 every core, -2 all but one, ...; 0 means nothing.
        "n_jobs": _bounds("[1, inf)", "a positive number of jobs at once, or -1 (one per core)",
                          choices=(-1,)),
        "prefer": _bounds(choices=("processes", "threads")),
        "require": _bounds(choices=(None, "sharedmem")),
        "verbose": _bounds("[0, inf)"),
        "timeout": _bounds("(0, inf)"),
        "mmap_mode": _bounds(choices=("r+", "r", "w+", "c"))},
    f"{_SUBMITIT}:BaseQueueConf": {
        "timeout_min": _bounds(COUNT), "cpus_per_task": _bounds(COUNT),
        "gpus_per_node": _bounds("[0, inf)"), "tasks_per_node": _bounds(COUNT),
        "mem_gb": _bounds("[0, inf)"),  # SLURM's --mem=0: all of a node's memory
        "nodes": _bounds(COUNT)},
    f"{_SUBMITIT}:SlurmQueueConf": {
        "cpus_per_gpu": _bounds(COUNT), "gpus_per_task": _bounds(COUNT),
        "signal_delay_s": _bounds("[0, inf)"), "max_num_timeout": _bounds("[0, inf)"),
        "array_parallelism": _bounds(COUNT)},
    f"{_OPTUNA}:OptunaSweeperConf": {
        "direction": _bounds(choices=f"{_OPTUNA}:Direction"),
        "n_trials": _bounds(COUNT), "n_jobs": _bounds(COUNT),
        "max_failure_rate": _bounds(SHARE)},
    f"{_OPTUNA}:TPESamplerConfig": {
        "seed": _bounds(SEED), "prior_weight": _bounds("(0, inf)"),
        "n_startup_trials": _bounds("[0, inf)"), "n_ei_candidates": _bounds(COUNT)},
}


def _plugin_schemas() -> dict[str, type]:
    """_target_ -> the dataclass a Hydra plugin registered for it in ConfigStore's hydra/
    groups: what a node names the plugin by (Optuna's sampler node is typed as the samplers'
    base class; its _target_ says which sampler, and so which dataclass)."""
    found: dict[str, type] = {}

    def walk(entries: dict) -> None:
        for entry in entries.values():
            if isinstance(entry, dict):
                walk(entry)
                continue
            node = getattr(entry, "node", None)
            schema = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
            target = OmegaConf.select(node, "_target_", throw_on_missing=False, default=None) \
                if schema is not None else None
            if dataclasses.is_dataclass(schema) and isinstance(target, str):
                found.setdefault(target, schema)

    walk(ConfigStore.instance().repo.get("hydra", {}))
    return found


def _plugin_schema(node: DictConfig, schemas: dict[str, type]) -> type | None:
    target = OmegaConf.select(node, "_target_", throw_on_missing=False, default=None)
    if isinstance(target, str) and target in schemas:
        return schemas[target]
    schema = OmegaConf.get_type(node)
    return schema if dataclasses.is_dataclass(schema) else None


def plugin_bounds(schema: type, spec: dataclasses.Field) -> dict:
    """A plugin field's ranges and choices: its own metadata, and PLUGIN_SETTINGS' for its
    dataclass or a base class of it."""
    metadata = dict(spec.metadata)
    for kind in reversed(schema.__mro__):
        metadata.update(PLUGIN_SETTINGS.get(f"{kind.__module__}:{kind.__qualname__}", {})
                        .get(spec.name, {}))
    interval = metadata.pop("interval", None)
    return {**_bounds(interval), **metadata} if interval else metadata


def plugin_fields(node: DictConfig, path: str, schemas: dict[str, type] | None = None):
    """(key, field, its bounds, its node) of each parameter of the plugin at `path`, its
    nested dataclasses' (gpu_pack's memory, Optuna's sampler) expanded."""
    schemas = _plugin_schemas() if schemas is None else schemas
    schema = _plugin_schema(node, schemas)
    for spec in dataclasses.fields(schema) if schema is not None else ():
        key = f"{path}.{spec.name}"
        if spec.name not in node:
            continue
        if dataclasses.is_dataclass(spec.type) and isinstance(node.get(spec.name), DictConfig):
            yield from plugin_fields(node.get(spec.name), key, schemas)
            continue
        yield key, spec, plugin_bounds(schema, spec), node


def check_launch(cfg: DictConfig) -> None:
    """A multirun's launcher and sweeper parameters held to their ranges and choices (their
    types OmegaConf held as Hydra composed), each refusal one line naming the key."""
    schemas = _plugin_schemas()
    for path in LAUNCH_NODES:
        node = OmegaConf.select(cfg, path)
        if not isinstance(node, DictConfig):
            continue
        for key, spec, bounds, parent in plugin_fields(node, path, schemas):
            if not bounds:
                continue
            value = parent.get(spec.name)
            if bounds.get("each") and isinstance(value, (ListConfig, DictConfig)):
                items = value.items() if isinstance(value, DictConfig) else enumerate(value)
                for name, item in items:
                    problem = _out_of_range(item, bounds)
                    if problem:
                        where = f"{key}.{name}" if isinstance(value, DictConfig) \
                            else f"{key}[{name}]"
                        _refuse(f"{where}={item!r}", bounds, problem)
                continue
            problem = _out_of_range(value, bounds)
            if problem:
                _refuse(f"{key}={value!r}{_set_by(parent, spec.name)}", bounds, problem)


def composed_field(cause) -> dataclasses.Field | None:
    """The schema field of a value OmegaConf refused while Hydra composed: bertkit's schema's,
    or the field of the plugin dataclass that holds it (hydra.launcher.jobs_per_gpu)."""
    spec = schema_field(cause.full_key)
    if spec is not None:
        return spec
    parent = getattr(cause, "parent_node", None)
    schema = (_plugin_schema(parent, _plugin_schemas()) if isinstance(parent, DictConfig)
              else getattr(cause, "object_type", None))
    if not dataclasses.is_dataclass(schema):
        return None
    return next((s for s in dataclasses.fields(schema) if s.name == cause.key), None)


register_schemas()
