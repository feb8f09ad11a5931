"""The typed config: one dataclass per node, holding every default and its one-line doc, so
that a bad value is refused at the edge, naming the key.

The root (RunSchema) and the groups of GROUPS are stored in Hydra's ConfigStore outside every
group (run_schema, <group>_schema) and listed in the defaults list before the group's choice:
the YAML files are presets that only override (tests/test_config_presets.py), and OmegaConf
refuses a value of the wrong type as Hydra composes (bertkit.cli names the key in one line).
The root is open while Hydra composes, because a recipe adds nodes of its own (pretraining,
heldout, corpus, ...), and closed once composed. The trainer's defaults are TrainingArguments'
own, written out (tests/test_config_schema.py holds them equal) so that neither `bertkit
--help` nor a refused value imports transformers; so are the choices of every key.
The nodes that task families and recipes extend with keys of their own (task, the pretraining
recipe's nodes) and the free-form model.config are checked, not composed: their schemas
(SETTINGS) name the keys every run shares, without defaults (the values are the YAML's), and
check_ranges holds the composed values to them, type by OmegaConf, once, as the job starts
(run_job). Ranges and choices are checked by check_ranges too, for the typed nodes as well:
dataclasses' __post_init__ would run only on OmegaConf.to_object, which the jobs do not call
(they read the DictConfig), and a validation library would check a second copy of the types.
What a type cannot say is in each field's metadata: its range, written as an interval
("[1, inf)", "(0, 1]") and stored as min, above, max, below; choices (a tuple); integer (a
field of type Any that must be a whole number when it is a number); `expect`, the message's
wording; `reads`, a path to a file or folder a run reads (input_keys: what bertkit-report
compares by content). Every number a user can type has both ends declared, inf saying that
side is genuinely unbounded (a batch size; stored as None), so that a key whose range nobody
thought about cannot pass for one that has none (tests/test_config_bounds.py walks every
composed config for such a key).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import operator
import types
import typing
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf, ValidationError

from bertkit.errors import BertkitError

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


# The choices of keys whose values a library or bertkit's code reads, written out so that
# checking a config imports neither torch nor transformers (`bertkit --help`, a refused
# value); tests/test_config_schema.py holds each to the list its reader keeps (CHOICE_SOURCES).
SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant",
              "constant_with_warmup", "inverse_sqrt", "reduce_lr_on_plateau", "cosine_with_min_lr",
              "cosine_warmup_with_min_lr", "warmup_stable_decay", "greedy")
OPTIMIZERS = (
    "adamw_torch", "adamw_torch_fused", "adamw_torch_xla", "adamw_torch_npu_fused", "adafactor",
    "adamw_anyprecision", "adamw_torch_4bit", "adamw_torch_8bit", "ademamix", "sgd", "adagrad",
    "adamw_bnb_8bit", "adamw_8bit", "ademamix_8bit", "lion_8bit", "lion_32bit",
    "paged_adamw_32bit", "paged_adamw_8bit", "paged_ademamix_32bit", "paged_ademamix_8bit",
    "paged_lion_32bit", "paged_lion_8bit", "rmsprop", "rmsprop_bnb", "rmsprop_bnb_8bit",
    "rmsprop_bnb_32bit", "galore_adamw", "galore_adamw_8bit", "galore_adafactor",
    "galore_adamw_layerwise", "galore_adamw_8bit_layerwise", "galore_adafactor_layerwise",
    "lomo", "adalomo", "grokadamw", "schedule_free_radam", "schedule_free_adamw",
    "schedule_free_sgd", "apollo_adamw", "apollo_adamw_layerwise", "stable_adamw")
SAMPLING = ("random", "sequential", "group_by_length", "batch_rebalance")
INTERVALS = ("no", "steps", "epoch")
SAVE_INTERVALS = (*INTERVALS, "best")
ACTIVATIONS = ("gelu", "gelu_10", "gelu_fast", "gelu_new", "gelu_python", "gelu_pytorch_tanh",
               "gelu_python_tanh", "gelu_accurate", "hardswish", "laplace", "leaky_relu",
               "linear", "mish", "quick_gelu", "relu", "relu2", "relu6", "sigmoid", "silu",
               "sqrtsoftplus", "swish", "tanh", "prelu", "xielu")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
PRECISIONS = ("auto", "bf16", "fp16", "no")
DATA_SOURCES = ("auto", "hub", "local")
AUTO_OR_BOOL = ("auto", True, False)  # progress_bars, pretraining.padding_free
ATTENTION = ("auto", "eager", "sdpa", "flash_attention_2", "flex_attention")
TAG_SCHEMES = ("auto", "iob1", "iob2")
NER_LAYERS = ("embeddings", "last", "second_to_last", "sum_last_four", "weighted_sum_last_four",
              "concat_last_four", "sum_all", "weighted_sum_all")
NER_CLASSIFIERS = ("linear", "bilstm")
POOLING = ("cls", "mean")
NOISE = ("normal", "uniform")
MASKING_KINDS = ("static", "dynamic")
MASKING_UNITS = ("token", "whole_word", "span")
MASKING_CONVENTIONS = ("google", "non_special")
CORPUS_FORMATS = ("google", "wikitext", "text")


@dataclass
class TrainerSchema:
    """The trainer group (conf/trainer/): TrainingArguments by their own names, those that
    bertkit's YAML files set, each default TrainingArguments' own (so that a key a YAML leaves
    out behaves as if it were not given; tests/test_config_schema.py holds them equal). Any
    other TrainingArguments key can still be added with +trainer.NAME=VALUE on a command
    line; a YAML that sets one must add it here."""

    learning_rate: float = field(default=5e-05, metadata=_bounds(LEARNING_RATE))
    per_device_train_batch_size: int = field(default=8, metadata=_bounds(COUNT))
    per_device_eval_batch_size: int = field(default=8, metadata=_bounds(COUNT))
    gradient_accumulation_steps: int = field(default=1, metadata=_bounds(COUNT))
    # Any, checked as a number by check_ranges: 2 stays 2 in sweep directory names (ep2), and
    # the default 3 (TrainingArguments' 3.0) is recorded as 3.
    num_train_epochs: Any = field(default=3, metadata=_bounds("(0, inf)"))
    max_steps: int = field(default=-1, metadata=_bounds("[-1, inf)"))  # -1: train by epochs
    # below 1: a share of all steps
    warmup_steps: float = field(default=0, metadata=_bounds("[0, inf)"))
    lr_scheduler_type: str = field(default="linear", metadata=_bounds(choices=SCHEDULERS))
    weight_decay: float = field(default=0.0, metadata=_bounds("[0, inf)"))
    adam_beta1: float = field(default=0.9, metadata=_bounds(PROBABILITY))
    adam_beta2: float = field(default=0.999, metadata=_bounds(PROBABILITY))
    adam_epsilon: float = field(default=1e-08, metadata=_bounds("(0, inf)"))
    max_grad_norm: float = field(default=1.0, metadata=_bounds("[0, inf)"))
    # adamw_torch_fused: one fused kernel per step (CPU and GPU); adamw_torch is the loop.
    optim: str = field(default="adamw_torch_fused", metadata=_bounds(choices=OPTIMIZERS))
    seed: int = field(default=42, metadata=_bounds(SEED))
    # random: run_glue.py's batch order, at parity with it (dynamic padding still saves what
    # padding to 128 wastes); group_by_length: faster still (1.36x on MiniLM MRPC) but 1.8
    # accuracy points below run_glue.py after one epoch (p = 0.026, cards/minilm.md).
    train_sampling_strategy: str = field(default="random", metadata=_bounds(choices=SAMPLING))
    eval_strategy: str = field(default="no", metadata=_bounds(choices=INTERVALS))
    eval_steps: float | None = field(default=None, metadata=_bounds("(0, inf)"))  # with steps
    save_strategy: str = field(default="steps", metadata=_bounds(choices=SAVE_INTERVALS))
    save_steps: float = field(default=500, metadata=_bounds("(0, inf)"))
    save_total_limit: int | None = field(default=None, metadata=_bounds(COUNT))
    # Keep the checkpoint with the best dev value of this metric (GLUE: validation_<metric>;
    # SQuAD and NER: f1) and load it at the end; also what early_stopping watches.
    metric_for_best_model: str | None = None
    load_best_model_at_end: bool = False
    logging_strategy: str = field(default="steps", metadata=_bounds(choices=INTERVALS))
    logging_steps: float = field(default=500, metadata=_bounds("(0, inf)"))
    logging_first_step: bool = False
    # auto or a number of worker processes (bertkit.training.run checks it).
    dataloader_num_workers: Any = field(default=0,
                                        metadata=_bounds("[0, inf)", choices=("auto",)))
    dataloader_persistent_workers: bool = False
    dataloader_prefetch_factor: int | None = field(default=None, metadata=_bounds(COUNT))
    include_num_input_tokens_seen: Any = "no"
    # auto (finetuning's default): compiled on a GPU for runs of compile_min_steps or more
    # (bertkit.training.trainer.decide_compile); true or false as given.
    torch_compile: Any = field(default=False, metadata=_bounds(choices=AUTO_OR_BOOL))
    # With torch_compile: reduce-overhead records CUDA graphs (the shapes are static),
    # max-autotune also searches kernels; null: reduce-overhead on a GPU for a finetune,
    # torch.compile's default otherwise.
    torch_compile_mode: str | None = field(default=None,
                                           metadata=_bounds(choices=COMPILE_MODES))
    ddp_find_unused_parameters: bool | None = None
    # null: from progress_bars (Trainer's bar on a terminal, plain log lines in a log).
    disable_tqdm: bool | None = None
    # Upload the model with its card (model_card) to the Hub repository hub_model_id
    # (<user>/<name>) at the end of the run, through Trainer's push_to_hub.
    push_to_hub: bool = False
    hub_model_id: str | None = None


def _default(value, interval: str | None = None, expect: str | None = None, **metadata):
    """A schema field: its one default (a list or mapping copied for each config) and
    _bounds' metadata."""
    if isinstance(value, (list, dict)):
        return field(default_factory=lambda: type(value)(value),
                     metadata=_bounds(interval, expect, **metadata))
    return field(default=value, metadata=_bounds(interval, expect, **metadata))


def _switch(value: bool):
    """A true/false field: true or false only, as YAML spells them. Typed Any, not bool, so
    that the check refuses a word: OmegaConf's bool would take 'yes', 'no', 'on' or 1 as Hydra
    composes, where bertkit has always asked for true or false."""
    return _default(value, choices=(True, False), expect="true or false")


DECAYS = ("linear", "cosine", "constant")  # the learning rate's shape after warm-up


@dataclass
class BudgetSchema:
    """budget.* (bertkit.training.stop_and_resume): train for a time budget. The learning rate
    follows the elapsed training time (warm-up, then the decay), replacing trainer.lr_scheduler_type
    and trainer.warmup_steps, and the run stops with a checkpoint at the first step past the
    time; trainer.max_steps / num_train_epochs remain an upper bound. Training time: the
    training loop's wall clock (Trainer's own evaluations included, bertkit's held-out
    measurements not); resume=true counts the time already spent. Not with train_fraction."""

    # null: off (train by steps/epochs).
    minutes: float | None = _default(None, "(0, inf)",
                                     "a positive number of minutes of training, or null (off)")
    # Share of the budget's time for linear warm-up from 0.
    warmup_fraction: float = _default(0.0, "[0, 1)", "a share of the budget's time in [0, 1)")
    # Shape after warm-up, down to min_lr_ratio x the peak rate when the time ends.
    decay: str = _default("linear", choices=DECAYS)
    min_lr_ratio: float = _default(0.0, "[0, 1]", "a share of the peak learning rate in [0, 1]")


@dataclass
class EarlyStoppingSchema:
    """early_stopping.*: stop after `patience` evaluations of trainer.metric_for_best_model
    (with trainer.load_best_model_at_end=true) without an improvement of more than
    `threshold`. GLUE names its metrics by dev split (validation_accuracy; MNLI:
    validation_matched_accuracy); SQuAD and NER select by f1 already."""

    patience: int | None = _default(
        None, COUNT, "a positive integer (or null to turn early stopping off)")
    threshold: float = _default(0.0, "[0, inf)")


@dataclass
class ModelCardSchema:
    """model_card.*: the Hub model card (README.md) written into every saved model directory
    and pushed with it by trainer.push_to_hub=true (bertkit/training/model_card.py); metadata
    (model-index with the dev scores, license, base model, tags) and the run's command, seed,
    hyperparameters and results. enabled=false: no card (a push carries Trainer's draft)."""

    enabled: Any = _switch(True)
    # The license of the weights (a Hub license id): BERT's and MiniLM's are apache-2.0.
    license: str = "apache-2.0"
    language: str = "en"
    tags: list[str] = _default(["bertkit"])
    # The Hub id of the base model when model.name_or_path is a local copy of one; null:
    # model.name_or_path when it names a Hub model, else the base model a local checkpoint
    # names itself (base_model in its README.md, else _name_or_path in its config.json).
    base_model: str | None = None


@dataclass
class DebugSchema:
    """debug.*: set by a debug preset (debug=smoke), read by the configs a job composes for
    itself (pretraining's downstream finetunes, two-stage finetuning's first stage)."""

    # The debug preset the run was composed with; null: none.
    preset: str | None = None


@dataclass
class RunSchema:
    """The root of every run's config (conf/config.yaml lists it as run_schema): the settings
    every job shares. Open while Hydra composes (a recipe adds nodes of its own: pretraining,
    heldout, corpus, ...), closed once composed (Hydra sets the root to struct), so that a
    typo on the command line is still refused."""

    seed: int = _default(42, SEED, "an integer in [0, 2**32 - 1] (numpy's and torch's seeds)")
    # Continue from the last checkpoint in the run directory (hydra.run.dir=<old run>): true,
    # auto (when there is one) or false.
    resume: Any = False
    # A directory holding a finished run is refused (resume=true|auto leaves it, exit 0);
    # true: the earlier run is set aside and removed once this run's training begins.
    overwrite: Any = _switch(False)
    # What a finished run keeps of its checkpoints once model/ and metrics.json are written:
    # false: none; true: as Trainer left them (trainer.save_total_limit) (docs/reliability.md).
    keep_checkpoints: Any = _switch(False)
    # fsync each checkpoint's files once saved (NFS, Lustre, a node crash); false: leave it to
    # the filesystem (a resume still skips a torn checkpoint).
    fsync_checkpoints: Any = _switch(True)
    # auto: bf16 on a GPU that has it, else fp16 on a GPU, else fp32; or bf16 | fp16 | "no".
    mixed_precision: str = _default("auto", choices=PRECISIONS)
    # Pad batches to a multiple of this under mixed precision (tensor cores); 1: off.
    pad_to_multiple_of: int | None = _default(8, COUNT)
    # DataLoader workers per training process that trainer.dataloader_num_workers=auto gives
    # on a GPU (on a CPU: 0).
    gpu_dataloader_workers: int = _default(6, "[0, inf)")
    # Under DDP the processes agree on stopping (preemption, the budget's clock) every this
    # many optimizer steps: one collective each time instead of one per step. 1: every step.
    agree_every_steps: int = _default(10, COUNT, "a positive number of optimizer steps")
    # Finetuning batches on a GPU or compiled are padded to a multiple of this many tokens (a
    # few shapes, one graph each); 1: each batch to its longest. Pretraining pads to its
    # phase's length. On a CPU without compile, to their longest unless buckets_on_cpu=true.
    bucket_width: int = _default(32, COUNT, "a positive number of tokens (1: no buckets)")
    # Buckets, and the last batch filled up with rows that weigh nothing, on a CPU too.
    buckets_on_cpu: Any = _switch(False)
    # trainer.torch_compile=auto compiles a finetune on a GPU from this many optimizer steps (a
    # cold compile pays back after 4,000-9,000 steps on an H100: cards/gpu.md, docs/speed.md).
    compile_min_steps: int = _default(4000, "[0, inf)",
                                      "a number of optimizer steps, 0 or more")
    # Progress bars (bertkit/training/run.py): auto on a terminal only, plain log lines
    # in a redirected log; true: every bar; false: none (trainer.disable_tqdm, when set, wins).
    progress_bars: Any = _default("auto", choices=AUTO_OR_BOOL)
    # Processes for datasets.map tokenisation.
    preprocessing_num_workers: int | None = _default(1, COUNT)
    # Where tokenised data is cached, shared by every run and sweep job.
    cache_dir: str = "${oc.env:BERTKIT_CACHE,${oc.env:HOME}/.cache/bertkit}"
    early_stopping: EarlyStoppingSchema = field(default_factory=EarlyStoppingSchema)
    # Train only this share of the schedule's optimizer steps, then checkpoint and evaluate
    # (successive halving's rungs); resume=true continues the schedule. null: all of it.
    train_fraction: float | None = _default(None, "(0, 1]",
                                            "a number in (0, 1], or null for the whole schedule")
    budget: BudgetSchema = field(default_factory=BudgetSchema)
    # Before the first Hub name a run looks up, one connection decides whether the Hub can
    # be reached, waiting at most this long; else the libraries go offline (the Hub cache
    # still serves). HF_HUB_OFFLINE=1 skips the check (docs/configuration.md).
    hub_check_seconds: float = _default(3.0, "(0, inf)", "a positive number of seconds")
    # Where a run's data files come from: hub, local, or auto (local when task.data_dir or a
    # task.*_file is set).
    data_source: str = _default("auto", choices=DATA_SOURCES)
    model_card: ModelCardSchema = field(default_factory=ModelCardSchema)
    debug: DebugSchema = field(default_factory=DebugSchema)


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
    tag_scheme: str = _setting(choices=TAG_SCHEMES)
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


@dataclass
class BertConfigSchema:
    """model.config (a model trained from scratch: BertConfig's keys)."""

    vocab_size: int = _setting(COUNT)
    hidden_size: int = _setting(COUNT)
    num_hidden_layers: int = _setting(COUNT)
    num_attention_heads: int = _setting(COUNT)
    intermediate_size: int = _setting(COUNT)
    max_position_embeddings: int = _setting(COUNT)
    type_vocab_size: int = _setting(COUNT)
    hidden_dropout_prob: float = _setting(PROBABILITY)
    attention_probs_dropout_prob: float = _setting(PROBABILITY)
    attn_implementation: str = _setting(choices=ATTENTION)
    hidden_act: str = _setting(choices=ACTIVATIONS)


@dataclass
class ModelFetchSchema:
    """model.fetch: where a preset's local files go and the command that gets them."""

    directory: str
    command: str


@dataclass
class FeatureBasedSchema:
    """model.feature_based: NER's feature-based tagger (the paper's Table 7), a BiLSTM or a
    linear layer on frozen BERT features; off unless enabled."""

    enabled: Any = _switch(False)
    # Which layers' outputs make the features (bertkit/tasks/ner/feature_based_tagger.py).
    layers: str = _default("concat_last_four", choices=NER_LAYERS)
    classifier: str = _default("bilstm", choices=NER_CLASSIFIERS)
    # Per direction.
    lstm_hidden_size: int = _default(768, COUNT)
    lstm_layers: int = _default(2, COUNT)
    # On the features and between/after the LSTM layers.
    dropout: float = _default(0.1, PROBABILITY)


@dataclass
class ModelSchema:
    """conf/model/ (stored as model_schema): a checkpoint (or null: trained from scratch, its
    sizes in config), its tokenizer, dropout, attention kernel, and whether code shipped with
    them may run."""

    # A Hub id or a directory; null: trained from scratch (model.config gives its sizes).
    # bertkit.training.models says which files are missing.
    name_or_path: str | None = _default(None, reads="folder")
    # A Hub tokenizer id or a directory holding vocab.txt (a checkpoint's preset names its
    # own: ${.name_or_path}); ??? until a preset or the command line gives it.
    tokenizer: str | None = _default(MISSING, reads="folder")
    do_lower_case: Any = _switch(True)
    hidden_dropout_prob: float = _default(0.1, PROBABILITY)
    attention_probs_dropout_prob: float = _default(0.1, PROBABILITY)
    # auto: FlashAttention-2 on a GPU where flash_attn is installed, else PyTorch SDPA; or
    # eager | sdpa | flash_attention_2 | flex_attention (bertkit/training/models.py).
    attn_implementation: str = _default("auto", choices=ATTENTION)
    # Code a checkpoint or tokenizer folder ships (an auto_map) runs only when true: read it
    # first (docs/reliability.md).
    trust_remote_code: Any = _switch(False)
    # BertConfig's keys for a model trained from scratch (model.config; BertConfigSchema).
    config: dict[str, Any] = _default({})
    # A preset whose files are fetched to a local folder (model=minilm_l6: make minilm).
    fetch: ModelFetchSchema | None = None
    feature_based: FeatureBasedSchema = field(default_factory=FeatureBasedSchema)
    # The checkpoint a run's model started from, where name_or_path is another run's
    # (two-stage finetuning's second stage); null: name_or_path itself.
    started_from: str | None = None


@dataclass
class IntermediateSchema:
    """finetuning.intermediate: two-stage finetuning (STILTs, Phang et al. 2018): finetune on
    an intermediate task first, then on the run's task from that encoder with a new head; both
    in one run directory (intermediate/ below it) and one W&B group."""

    # A task of conf/task/ (e.g. mnli); null: one stage.
    task: str | None = None
    # Its data (like task.data_dir).
    data_dir: str | None = None
    # The trainer.* keys that differ for the first stage.
    trainer: dict[str, Any] = _default({})


@dataclass
class LoraSchema:
    """finetuning.lora: LoRA (Hu et al. 2021) with peft: low-rank adapters on the target
    modules, the task head trained and saved in full; merged before evaluation and saving."""

    enabled: Any = _switch(False)
    r: int = _default(8, COUNT)
    alpha: float = _default(16.0, "(0, inf)")
    dropout: float = _default(0.1, PROBABILITY)
    target_modules: list[str] = _default(["query", "value"])
    # null: the task head (classifier, qa_outputs, ...; the scalar mix too) trains in full.
    modules_to_save: list[str] | None = None
    # BERT's pooler trains in full too, as RoBERTa's classification head's dense layer does in
    # Hu et al.; false: frozen, peft's plain SEQ_CLS way.
    train_pooler: Any = _switch(True)


@dataclass
class R3FSchema:
    """finetuning.r3f: R3F (Aghajanyan et al. 2020): adds weight x the symmetric KL between
    the predictions on clean and noise-perturbed word embeddings."""

    # 0: off.
    weight: float = _default(0.0, "[0, inf)")
    # normal (N(0, eps^2)) or uniform (U(-eps, eps)).
    noise: str = _default("normal", choices=NOISE)
    eps: float = _default(1e-5, "(0, inf)")


@dataclass
class FinetuningSchema:
    """conf/finetuning/ (stored as finetuning_schema): BERTology's finetuning methods
    (bertkit.finetuning), all off by default: plain full finetuning, the paper's. Recorded in
    metrics.json ("finetuning") and in the W&B config under these names."""

    # The method's name in metrics.json, W&B and bertkit-report's tables.
    name: str = "full"
    # Freezing: the embeddings and/or the bottom k encoder layers get no gradient.
    freeze_embeddings: Any = _switch(False)
    freeze_layers: int = _default(0, "[0, inf)")  # above: the model's layers
    # Layer-wise learning-rate decay (Sun et al. 2019: 0.95): encoder layer l of L gets
    # trainer.learning_rate * decay^(L - l), the embeddings decay^L; 1: all alike; never
    # above 1 (lower layers faster).
    layer_lr_decay: float = _default(1.0, "(0, 1]")
    # The task head's rate: trainer.learning_rate * head_lr_multiplier.
    head_lr_multiplier: float = _default(1.0, "(0, inf)")
    # Gradual unfreezing (ULMFiT): one more layer every `unfreeze_every`: epoch, or a whole
    # number of optimizer steps; null: off.
    unfreeze_every: Any = _default(None, COUNT,
                                   "epoch, a number of optimizer steps >= 1, or null (off)",
                                   choices=("epoch",), integer=True)
    # Re-initialise the top k encoder layers (Zhang et al. 2021); reinit_pooler: the pooler too.
    reinit_layers: int = _default(0, "[0, inf)")  # above: the model's layers
    reinit_pooler: Any = _switch(False)
    # The head reads a learned softmax-weighted mix of every layer's output (Kondratyuk &
    # Straka 2019) instead of the last layer.
    layer_mix: Any = _switch(False)
    # Classification's sentence vector: cls (through BERT's pooler, the paper's) or mean.
    pooling: str = _default("cls", choices=POOLING)
    intermediate: IntermediateSchema = field(default_factory=IntermediateSchema)
    lora: LoraSchema = field(default_factory=LoraSchema)
    r3f: R3FSchema = field(default_factory=R3FSchema)
    # BitFit (Ben Zaken et al. 2022): only the biases (and the head) train.
    bitfit: Any = _switch(False)


@dataclass
class MaskingSchema:
    """conf/masking/ (stored as masking_schema) and heldout.masking (bertkit.pretraining.
    masking): the paper's 15% with 80% [MASK] / 10% random / 10% unchanged, masked anew each
    time a sequence is fed (dynamic) or in dupe_factor fixed copies (static)."""

    kind: str = _default("dynamic", choices=MASKING_KINDS)
    mlm_probability: float = _default(0.15, "(0, 1)")
    # Replaced by [MASK].
    mask_token_fraction: float = _default(0.8, SHARE)
    # Replaced by a random token (convention); the rest stay unchanged.
    random_token_fraction: float = _default(0.1, SHARE)
    # Google's default at max_seq_length 128 (80 at 512).
    max_predictions_per_seq: int = _default(20, COUNT)
    # token | whole_word | span (SpanBERT).
    unit: str = _default("token", choices=MASKING_UNITS)
    # google: as create_pretraining_data.py (the count is min(max_predictions_per_seq,
    # max(1, round(tokens * mlm_probability))), [CLS] and [SEP] counted; any token but
    # [CLS]/[SEP]/padding may be masked; replacements from the whole vocabulary);
    # non_special: the count of the non-special tokens, no special token masked or drawn.
    convention: str = _default("google", choices=MASKING_CONVENTIONS)
    # Span length in words ~ Geometric(p), SpanBERT's 0.2.
    span_geometric_p: float = _default(0.2, "(0, 1]")
    span_max_words: int = _default(10, COUNT)
    # Static masking's copies of the data, each masked once (Google's 10).
    dupe_factor: int = _default(10, COUNT)


@dataclass
class ObjectiveSchema:
    """conf/objective/ (stored as objective_schema): the registered objectives' values
    (bertkit.pretraining.objective); by default the paper's, MLM + NSP on sentence pairs."""

    # No choices for name, sentence_task and packing here: the OBJECTIVES table is open (an
    # objective of one's own registers there, with values of its own), and
    # bertkit.pretraining.objective.objective_of refuses a name or value no registered
    # objective has, in one line naming the key.
    name: str = "mlm_nsp"
    # The sentence-level task: nsp | sop | null (none).
    sentence_task: str | None = "nsp"
    # pairs: [CLS] A [SEP] B [SEP]; full_sentences: [CLS] sentences [SEP].
    packing: str = "pairs"


@dataclass
class LoggerSchema:
    """conf/logger/ (stored as logger_schema): Weights & Biases. A single run is grouped by
    recipe and dataset, named by dataset, seed and start time; a multirun (bertkit -m) is a
    sweep with an id of its own per launch, its runs tagged sweep:<sweep_id>, grouped by the
    job's swept settings but replicate_keys and named by them (training/wandb_logging.py)."""

    # wandb, or none (logger=none: no W&B run).
    backend: str = "wandb"
    # auto (online with credentials, else offline, said once) | online | offline | disabled;
    # WANDB_MODE in the environment overrides it.
    mode: str = "auto"
    project: str = "bertkit"
    entity: str | None = None
    # A multirun's id: <sweep_tag or multirun>-<the multirun directory's name>; null in a
    # single run.
    sweep_id: str | None = "${bertkit_sweep_id:${.sweep_tag}}"
    replicate_keys: list[str] = _default(["seed"])
    group: str = ("${bertkit_wandb_group:${.sweep_id},${.replicate_keys},"
                  "${recipe.name}-${recipe.dataset}}")
    name: str = ("${bertkit_wandb_name:${.sweep_id},${recipe.dataset},"
                 "${recipe.dataset}-seed${seed}-${bertkit_run_stamp:}}")
    tags: list[str] = _default(["recipe:${recipe.name}", "task:${task.name}", "seed:${seed}"])
    # The sweep a run belongs to (set by sweep presets): a multirun's id prefix; in a single
    # run a tag (sweep:<name>) and a name prefix.
    sweep_tag: str | None = None


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
    # auto, true or false (bertkit.pretraining.batches: padding-free batches)
    padding_free: Any = _setting(choices=AUTO_OR_BOOL)
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
class CorpusHubSchema:
    """corpus.hub: a Hugging Face dataset as the corpus (corpus.source=hub)."""

    path: str | None = None
    # The dataset's configuration.
    name: str | None = None
    split: str = "train"
    text_column: str = "text"
    # Read as training consumes it, nothing downloaded up front.
    streaming: Any = _switch(False)
    # Rows joined into one document (one row: one document).
    rows_per_document: int = _default(1, COUNT)


@dataclass
class CorpusSchema:
    """conf/corpus/ (stored as corpus_schema): pretraining's text, local files or a Hub
    dataset (bertkit/pretraining/corpora.py)."""

    name: str = MISSING
    # local: files on disk (files, format); hub: a Hugging Face dataset (hub).
    source: str = _default("local", choices=("local", "hub"))
    # Local files only (null for a Hub corpus): google (a sentence a line, a blank line
    # between documents), wikitext (raw WikiText, articles at ` = Title = `) or text (plain
    # prose, one document per file). corpus.parts' own formats are checked where they are
    # read (bertkit.pretraining.corpora), a list's items being out of a schema's reach.
    format: str | None = _default("google", choices=CORPUS_FORMATS)
    # Files or glob patterns (sorted when expanded), read in this order; whether they exist is
    # checked when they are read. ??? until a preset or the command line gives them.
    files: Any = _default(MISSING, reads="files")
    # Files in several formats instead: [{format, files}].
    parts: Any = _default(None, reads="files")
    # Only the first this many documents (quick runs); null: all.
    max_documents: int | None = _default(None, COUNT, "null (all) or a positive integer")
    hub: CorpusHubSchema = field(default_factory=CorpusHubSchema)
    # A generated corpus's sizes (corpus=demo; SyntheticSchema, checked as the job starts).
    synthetic: Any = None


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
class PeakTflopsSchema:
    """throughput.peak_tflops.<GPU>: a card's dense peak by precision (MFU's denominator)."""

    bf16: float = _setting("(0, inf)")
    fp16: float = _setting("(0, inf)")
    fp32: float = _setting("(0, inf)")
    tf32: float = _setting("(0, inf)")


# group -> its schema, stored outside every group as <group>_schema (each YAML of the group
# lists `/<group>_schema@_here_` first, or a preset that does): in the group it would be offered
# as one of its choices by `bertkit --help` and tab completion (trainer=schema), and it is no
# setting a user picks. The root's, RunSchema, is stored as run_schema (conf/config.yaml).
GROUPS = {"trainer": TrainerSchema, "model": ModelSchema, "finetuning": FinetuningSchema,
          "masking": MaskingSchema, "objective": ObjectiveSchema, "corpus": CorpusSchema,
          "logger": LoggerSchema}
# node -> its schema, for every node OmegaConf types as Hydra composes (a wrong type refused
# then; ranges and choices by check_ranges), the root ("") first: the trainer group
# interpolates the root's seed.
SCHEMAS = {"": RunSchema, "early_stopping": EarlyStoppingSchema, "budget": BudgetSchema,
           "model_card": ModelCardSchema, "debug": DebugSchema, **GROUPS,
           "model.fetch": ModelFetchSchema, "model.feature_based": FeatureBasedSchema,
           "finetuning.intermediate": IntermediateSchema, "finetuning.lora": LoraSchema,
           "finetuning.r3f": R3FSchema, "corpus.hub": CorpusHubSchema}
# node -> the schema of the keys it must hold to, for the nodes that task families and
# recipes extend with keys of their own (task, the pretraining recipe's nodes) and the
# free-form ones (model.config: BertConfig's keys); checked, not composed. A `*` in a path
# stands for every key of that node (each GPU of throughput.peak_tflops).
SETTINGS = {
    "task": TaskSchema, "task.columns": ConllColumnsSchema,
    "task.headerless_columns": HeaderlessColumnsSchema, "task.synthetic": SyntheticSchema,
    "model.config": BertConfigSchema, "pretraining": PretrainingSchema,
    "pretraining.long_phase": LongPhaseSchema, "heldout": HeldoutSchema,
    "heldout.masking": MaskingSchema, "corpus.synthetic": SyntheticSchema,
    "tokenizer_training": TokenizerTrainingSchema, "throughput.peak_tflops.*": PeakTflopsSchema}


def register_schemas() -> None:
    """Each group's schema as <group>_schema; the root's as run_schema, open while Hydra
    composes (struct false: a recipe's own nodes are added), which Hydra closes once composed
    (it sets the root to struct before it applies the command line's overrides)."""
    store = ConfigStore.instance()
    for group, schema in GROUPS.items():
        store.store(name=f"{group}_schema", node=schema)
    store.store(name="run_schema", node=OmegaConf.structured(RunSchema, flags={"struct": False}))


def choices_of(bounds) -> tuple | None:
    """A field's choices, each as a config holds it (an Enum default of a plugin's field, as
    Optuna's direction, by its word)."""
    choices = bounds.get("choices")
    return None if choices is None else tuple(_choice(item) for item in choices)


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
    """The config's values held to their schemas, before a job starts: the SETTINGS nodes'
    types and ranges, then the typed nodes' ranges (their types were checked at composition);
    as done, for the config checked_once checked (finetune's, pretrain's own call). The
    untyped first: a typed key may take its value from one (trainer.learning_rate:
    ${task.learning_rate}), and the message then names the key the user set."""
    if cfg is _CHECKED.get():
        return
    for path, schema in SETTINGS.items():
        for at, node in nodes(cfg, path):
            _check_node(at, node, schema, typed=False)
    for path, schema in SCHEMAS.items():
        for at, node in nodes(cfg, path):
            _check_node(at, node, schema, typed=True)


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
                 for path, schema in {**SCHEMAS, **SETTINGS}.items()
                 for spec in dataclasses.fields(schema) if spec.metadata.get("reads"))


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
        "direction": _bounds(choices=("minimize", "maximize")),
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
            target = _target(node) if schema is not None else None
            if dataclasses.is_dataclass(schema) and isinstance(target, str):
                found.setdefault(target, schema)

    walk(ConfigStore.instance().repo.get("hydra", {}))
    return found


def _target(node: DictConfig) -> str | None:
    """A plugin node's `_target_` (Hydra's key: the class it instantiates), None without one."""
    return node["_target_"] if "_target_" in node and not OmegaConf.is_missing(node, "_target_") \
        else None


def _plugin_schema(node: DictConfig, schemas: dict[str, type]) -> type | None:
    target = _target(node)
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
