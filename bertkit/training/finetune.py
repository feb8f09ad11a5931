"""The finetune job for every task family, read top-down in `finetune`, one line per stage:
settings checked, the run started (bertkit.training.run), data, model, Trainer (prepare_run),
train, then evaluate and save, metrics.json, the card, W&B and the printout (publish) and
the Hub push (finish_run). Each stage is a function below, in the order they call them; a
model array (bertkit.training.fused_finetune) runs prepare_run and finish_run of each of its
members around one training of them all.

The family (a TaskFamily, at the end of this module: what the job asks of a family) supplies
what differs between GLUE, SQuAD, SWAG and NER (data, head, trainer, evaluation); each family
subclasses it in its own folder (bertkit/tasks/<family>/family.py), named in
bertkit.tasks.FAMILIES. bertkit.finetuning.methods supplies the methods the `finetuning`
node turns on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig
from transformers import PreTrainedModel, PreTrainedTokenizerBase, Trainer, TrainingArguments

from bertkit.config_schema import check_ranges
from bertkit.data.cache import model_input_fingerprints
from bertkit.data.metrics_file import (
    INPUT_FINGERPRINTS,
    LIMITED_SAMPLES,
    METRICS_FILE,
    cut_line,
    limited_samples,
    metrics_record,
)
from bertkit.data.task_data import SAMPLE_LIMIT_KEYS, TaskData, TaskSplits, first_examples
from bertkit.errors import BertkitError
from bertkit.finetuning.methods import ActiveMethods
from bertkit.training.models import check_model_settings, load_tokenizer, tokenizer_size
from bertkit.training.run import (
    Outcome,
    RunSetup,
    TrainingRun,
    publish,
    push_if_asked,
    result_header,
    saving_model,
    start_run,
    train_run,
)
from bertkit.training.trainer import (
    CompileRecord,
    PaddedRows,
    compile_graphs,
    decide_compile,
    planned_steps,
    prepare_compile,
    use_padded_rows,
)
from bertkit.training.wandb_logging import paper_hyperparameters


def finetune(cfg: DictConfig, family: TaskFamily, run_dir: Path | None = None,
             details: dict | None = None) -> dict:
    """Finetunes cfg.task with `family`; returns the metrics.json record (`details`: facts of
    the run's context added to its details, e.g. two-stage finetuning's first stage)."""
    run = prepare_run(cfg, family, run_dir, details)
    trained = train_run(cfg, run.setup, run.trainer, run.hyperparameters,
                        limited_samples=run.limited)
    return finish_run(run, trained)


@dataclass
class PreparedRun:
    """A finetune up to Trainer.train: what finish_run reads once it has trained (alone, or as
    a member of a model array: bertkit.training.fused_finetune)."""

    cfg: DictConfig
    family: TaskFamily
    methods: ActiveMethods
    setup: RunSetup
    inputs: Inputs
    hyperparameters: dict
    compiling: CompileRecord | None
    trainer: Trainer
    limited: dict[str, dict]
    details: dict | None


def prepare_run(cfg: DictConfig, family: TaskFamily, run_dir: Path | None = None,
                details: dict | None = None) -> PreparedRun:
    """Settings checked, the run started, data, model and Trainer: everything before train."""
    check_ranges(cfg)  # the schema's, for callers other than run_job (whose check covers this)
    methods = check_settings(cfg.task, cfg.model, cfg.finetuning, cfg.data_source, family)
    setup = start_run(cfg, run_dir)
    inputs = prepare_data(cfg.task, cfg.model, family, setup.args, cfg.data_source,
                          cfg.cache_dir, cfg.preprocessing_num_workers)
    model, hyperparameters = build_model(cfg.task, cfg.model, family, methods, setup.args,
                                         inputs)
    compiling = compile_if_it_pays(cfg, setup.args, len(inputs.data.features["train"]),
                                   cfg.task.max_seq_length)
    trainer = build_trainer(cfg.task, family, methods, setup, model, inputs)
    limited = limited_parts(inputs.splits, details)
    return PreparedRun(cfg, family, methods, setup, inputs, hyperparameters, compiling, trainer,
                       limited, details)


def finish_run(run: PreparedRun, trained: TrainingRun) -> dict:
    """The trained model evaluated and saved, metrics.json, the card, W&B, the printout and
    the Hub push; returns the metrics.json record."""
    cfg, family, trainer, inputs = run.cfg, run.family, run.trainer, run.inputs
    evaluation = evaluate_and_save(cfg.task, family, run.methods, trainer, inputs.data,
                                   run.setup.run_dir, trained.main)
    record = metrics_record(
        header=result_header(cfg.recipe.name, cfg.task, cfg.model, family.name,
                             trainer.args.seed,
                             main_value(evaluation, cfg.task.main_metric)),
        validation=evaluation.validation, test=evaluation.test,
        train=trained.train_record(**family.train_sizes(inputs.data)),
        hyperparameters=trained.hyperparameters, files=evaluation.files,
        details=run_details(inputs, evaluation, run.methods, run.compiling, run.details,
                            run.limited))
    publish(run.setup, trained, Outcome(
        record, final_scores(evaluation, run.methods),
        (record["main_metric"], record["main_value"]),
        lambda where: _printout(cfg.task, family, record, evaluation, trainer,
                                run.setup.run_dir, where)))
    push_if_asked(run.setup, trainer, record)
    return record


@dataclass
class Inputs:
    """What prepare_data read: the splits as read, the tokenizer, the model's features and the
    content fingerprints of the checkpoint and tokenizer."""

    splits: TaskSplits
    tokenizer: PreTrainedTokenizerBase
    data: TaskData
    fingerprints: dict


def check_settings(task: DictConfig, model: DictConfig, finetuning: DictConfig,
                   data_source: str, family: TaskFamily) -> ActiveMethods:
    """The rules between settings a finetune checks before it reads anything: the finetuning
    methods' keys, the family's, and the model's sizes against the task."""
    methods = ActiveMethods(finetuning)
    family.check(task, model)
    check_model_for_task(task, model, data_source, family, tokenizer_size(model))
    return methods


def prepare_data(task: DictConfig, model: DictConfig, family: TaskFamily, args,
                 data_source: str, cache_dir: str, num_proc: int | None) -> Inputs:
    """Generated data, then the splits, then the tokenizer and the features, in that order so
    that a bad data file is reported before a missing tokenizer; the main process first (the
    others read its cache)."""
    with args.main_process_first(desc=family.preparing):
        family.generate_data(task)
        # task.max_*_samples: the first N examples, before any tokenisation (smoke runs)
        splits = first_examples(family.read(task, data_source), sample_limits(task))
        tokenizer = load_tokenizer(model)
        # The local checkpoint and tokenizer by content (hashed once here, remembered in the
        # cache for the other processes and runs), for the report as data_fingerprint below.
        fingerprints = model_input_fingerprints(model, tokenizer, cache_dir)
        # Again with what only loading tells: a Hub checkpoint's config, a generated vocabulary.
        check_model_for_task(task, model, data_source, family, len(tokenizer), local_only=False)
        data = family.featurize(task, splits, tokenizer, cache_dir, num_proc)
    return Inputs(splits, tokenizer, data, fingerprints)


def build_model(task: DictConfig, model_node: DictConfig, family: TaskFamily,
                methods: ActiveMethods, args, inputs: Inputs) -> tuple[PreTrainedModel, dict]:
    """The family's model with the finetuning methods applied, and the run's hyperparameters
    under the paper's names (taken before the methods change the model)."""
    model = family.build_model(task, model_node, inputs.tokenizer, inputs.data)
    hyperparameters = {**paper_hyperparameters(args, model, task.max_seq_length),
                       **family.hyperparameters(task, model), **methods.hyperparameters()}
    return methods.apply(model), hyperparameters


def build_trainer(task: DictConfig, family: TaskFamily, methods: ActiveMethods, setup: RunSetup,
                  model: PreTrainedModel, inputs: Inputs) -> Trainer:
    """The family's BertkitTrainer, its short batches filled to full rows where static shapes
    pay (one graph per bucket), with the finetuning methods' optimizer groups and callbacks."""
    trainer = family.build_trainer(task, setup.args, model, inputs.tokenizer, inputs.data,
                                   setup.pad_to_multiple_of)
    trainer.loss_labels = family.padded_rows(task)  # what the loss averages over
    if setup.static_shapes:
        use_padded_rows(trainer, trainer.loss_labels)
    methods.attach(trainer)
    return trainer


def evaluate_and_save(task: DictConfig, family: TaskFamily, methods: ActiveMethods,
                      trainer: Trainer, data: TaskData, run_dir: Path, main: bool) -> Evaluation:
    """The methods' end (LoRA: the merged model is what is evaluated and saved), the family's
    evaluation of the final model, and the model saved under run_dir/model."""
    methods.finish(trainer, run_dir, main)
    evaluation = family.evaluate(task, trainer, data, run_dir, main)
    with saving_model(run_dir / "model", main):
        family.save_model(trainer, run_dir, main)
    return evaluation


def limited_parts(splits: TaskSplits, context: dict | None) -> dict[str, dict]:
    """The splits cut to their first examples (task.max_*_samples), with those of the run's
    context (two-stage finetuning's first stage: its cuts are this run's too)."""
    return {**(context or {}).get(LIMITED_SAMPLES, {}), **splits.limited}


def run_details(inputs: Inputs, evaluation: Evaluation, methods: ActiveMethods,
                compiling: CompileRecord | None, context: dict | None,
                limited: dict[str, dict]) -> dict:
    """metrics.json's details. data_fingerprint and input_fingerprints: the content of the data,
    checkpoint and tokenizer, so that the report tells runs on the same files apart from runs
    on other files whatever path each was given (reporting.identity)."""
    splits = inputs.splits
    return {"data_fingerprint": splits.fingerprint(), INPUT_FINGERPRINTS: inputs.fingerprints,
            **inputs.data.facts, **evaluation.details, **(context or {}),
            # a run on the first N examples of a split is no result on the task
            # (bertkit.data.metrics_file)
            **({LIMITED_SAMPLES: limited} if limited else {}),
            **({"compile": compiling.facts()} if compiling else {}),
            **({"finetuning": facts} if (facts := methods.record()) else {})}


def final_scores(evaluation: Evaluation, methods: ActiveMethods) -> dict[str, float]:
    """W&B's final/<split>/<metric>, and what the methods learned (the mix's weights, LoRA's
    share of trained parameters, ...)."""
    final = {f"{split}/{metric}": value
             for split, scores in {**evaluation.validation, **evaluation.test}.items()
             for metric, value in scores.items()}
    final.update(methods.summary())
    return final


def sample_limits(task: DictConfig) -> dict[str, int | None]:
    """task.max_train_samples, max_eval_samples and max_predict_samples (None: all examples;
    a task conf of a user's that lacks them reads as None)."""
    return {key: task.get(key) for key in SAMPLE_LIMIT_KEYS.values()}


def compile_if_it_pays(cfg: DictConfig, args, train_rows: int,
                       max_seq_length: int) -> CompileRecord | None:
    """trainer.torch_compile decided for this run's length (trainer.decide_compile) and,
    compiled, Dynamo prepared for its graphs; returns what will record the compile's cost."""
    decide_compile(cfg, args, planned_steps(args, train_rows, args.world_size))
    if not args.torch_compile:
        return None
    prepare_compile(cfg.cache_dir, compile_graphs(max_seq_length, cfg.bucket_width))
    return CompileRecord()


def check_model_for_task(task: DictConfig, model: DictConfig, data_source: str,
                         family: TaskFamily, tokens: int | None,
                         local_only: bool = True) -> None:
    """The model's sizes against the task (bertkit.training.models.check_model_settings):
    its length, whether it feeds a second segment, the tokenizer's `tokens` (None: unknown)."""
    check_model_settings(model, {"task.max_seq_length": task.max_seq_length},
                         family.second_segment(task, data_source), tokens, local_only)


def main_value(evaluation: Evaluation, main_metric: str) -> float:
    """The main metric on the first dev split (MNLI: matched), the value runs are ranked by."""
    split, scores = next(iter(evaluation.validation.items()))
    if main_metric not in scores:
        raise BertkitError(f"task.main_metric={main_metric} is not among the scores of the "
                           f"{split} split: {', '.join(scores)}")
    return scores[main_metric]


def _printout(task: DictConfig, family: TaskFamily, record: dict, evaluation: Evaluation,
              trainer: Trainer, run_dir: Path, where: str) -> str:
    width = max(len(name) + 1 for name in ["checkpoints", *evaluation.files])
    files = "".join(f"\n  {name + ':':<{width}} {path}" for name, path in evaluation.files.items())
    cut = cut_line(limited_samples(record), task.name)
    return (f"\n{task.name}: {task.main_metric} = {record['main_value']:.4f} "
            f"({family.headline(record)})\n{cut}"
            f"  {'metrics:':<{width}} {run_dir / METRICS_FILE}{files}\n"
            f"  {'model:':<{width}} {run_dir / 'model'}\n"
            f"{checkpoints_line(Path(trainer.args.output_dir), width)}"
            f"  {where}")


def checkpoints_line(output_dir: Path, width: int) -> str:
    """The printout's line naming the checkpoints folder, when the run kept any (a finished
    run keeps none unless keep_checkpoints=true; a run cut by train_fraction keeps them)."""
    if not any(output_dir.glob("checkpoint-*")):
        return ""
    return f"  {'checkpoints:':<{width}} {output_dir}\n"


# ================================================================================================
# What a task family supplies to the one finetune job: a small spec of the steps that differ
# between families. Everything else (arguments, seed, data under main_process_first, trainer,
# train, evaluate, metrics.json, W&B, the printout) is written once, above.

@dataclass
class Evaluation:
    """The final model's scores and files, in metrics.json's shape (bertkit.data.metrics_file)."""

    validation: dict[str, dict[str, float]]  # dev split -> metric -> value
    test: dict[str, dict[str, float]] = field(default_factory=dict)  # labelled test splits
    files: dict[str, str] = field(default_factory=dict)  # name -> written file
    details: dict = field(default_factory=dict)  # the family's own facts for metrics.json


class TaskFamily:
    """One task family's steps. `name` is task.family; `preparing` says what reading and
    featurizing do (the log line of main_process_first).

    Each step gets the settings it reads, not the whole config: the `task` node first, then
    the `model` node, data_source or the preprocessing keys where it reads them."""

    name: str
    preparing = "reading and tokenizing the data"

    def check(self, task: DictConfig, model: DictConfig) -> None:
        """Settings errors, before any data is read."""

    def second_segment(self, task: DictConfig, data_source: str) -> str | None:
        """The setting that makes this task feed the model a second segment (token type 1:
        a sentence pair, a question and its passage), as `key=value` for messages; None when
        every input is one segment. check_model_settings holds model's token types to it."""
        return None

    def generate_data(self, task: DictConfig) -> None:
        """Write generated data sets (the embedded demo) before the tokenizer or the reader
        looks for their files; a no-op for real data."""

    def read(self, task: DictConfig, data_source: str) -> TaskSplits:
        """The raw splits, from local files or the Hub (bertkit.data.task_data). Before the
        tokenizer loads, so that a bad data file is reported before a missing tokenizer."""
        raise NotImplementedError

    def featurize(self, task: DictConfig, splits: TaskSplits,
                  tokenizer: PreTrainedTokenizerBase, cache_dir: str | None,
                  num_proc: int | None) -> TaskData:
        """The model's features of every split (cached under cache_dir: bertkit.data.cache;
        num_proc: preprocessing_num_workers)."""
        raise NotImplementedError

    def build_model(self, task: DictConfig, model: DictConfig,
                    tokenizer: PreTrainedTokenizerBase,
                    data: TaskData) -> PreTrainedModel:
        raise NotImplementedError

    def build_trainer(self, task: DictConfig, args: TrainingArguments, model: PreTrainedModel,
                      tokenizer: PreTrainedTokenizerBase, data: TaskData,
                      pad_to_multiple_of: int | None) -> Trainer:
        raise NotImplementedError

    def padded_rows(self, task: DictConfig) -> PaddedRows:
        """How the rows that fill a short batch up to its batch size weigh nothing (static
        shapes: bertkit.training.trainer): by default, labels the loss ignores (-100)."""
        return PaddedRows()

    def hyperparameters(self, task: DictConfig, model: PreTrainedModel) -> dict:
        """The family's settings beyond the paper's, for W&B and metrics.json."""
        return {}

    def train_sizes(self, data: TaskData) -> dict:
        """How much data one epoch is, for metrics.json's train record."""
        return {"examples": len(data.features["train"])}

    def evaluate(self, task: DictConfig, trainer: Trainer, data: TaskData, run_dir: Path,
                 main: bool) -> Evaluation:
        """The final model (the best checkpoint's, with load_best_model_at_end) on the dev and
        labelled test splits; prediction files written by the main process only."""
        raise NotImplementedError

    def save_model(self, trainer: Trainer, run_dir: Path, main: bool) -> None:
        trainer.save_model(str(run_dir / "model"))

    def headline(self, summary: dict) -> str:
        """The scores in the printout after `<task>: <main metric> = <value>`."""
        return "; ".join(f"{split}: " + ", ".join(f"{k} {v:.4f}" for k, v in scores.items()
                                                  if isinstance(v, float))
                         for split, scores in {**summary["validation"],
                                               **summary["test"]}.items())
