"""Finetuning any task family, read top-down in `finetune`: the family (bertkit.training.family)
supplies what differs between GLUE, SQuAD, SWAG and NER (data, head, trainer, evaluation),
the finetuning toolbox (bertkit.finetuning.toolbox) the methods of the `finetuning` node, and
bertkit.training.run the steps every job shares.

Written once here: generated data, then the splits, then the tokenizer and the features (in
that order, so that a bad data file is reported before a missing tokenizer); the paper's
hyperparameters; metrics.json in the one schema (bertkit.data.metrics_file); final/<split>/
<metric> in W&B; the printout.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig
from transformers import Trainer

from bertkit.config_schema import check_ranges
from bertkit.data.fingerprints import model_input_fingerprints
from bertkit.data.metrics_file import INPUT_FINGERPRINTS, METRICS_FILE, metrics_record
from bertkit.data.task_data import SAMPLE_LIMIT_KEYS, first_examples
from bertkit.errors import BertkitError
from bertkit.finetuning.toolbox import Toolbox
from bertkit.training.family import Evaluation, TaskFamily
from bertkit.training.models import check_model_settings, load_tokenizer, tokenizer_size
from bertkit.training.run import (
    Outcome,
    publish,
    push_if_asked,
    result_header,
    saving_model,
    start_run,
    train_run,
)
from bertkit.training.static_shapes import (
    CompileRecord,
    CompileSettings,
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
    check_ranges(cfg)  # each value's type and range first, for callers other than run_job too
    toolbox = Toolbox(cfg.finetuning)  # the rules between finetuning.* keys
    family.check(cfg.task, cfg.model)
    check_model_for_task(cfg.task, cfg.model, cfg.data_source, family,
                         tokenizer_size(cfg.model))
    setup = start_run(cfg, run_dir)
    with setup.args.main_process_first(desc=family.preparing):
        family.generate_data(cfg.task)
        # task.max_*_samples: the first N examples, before any tokenisation (smoke runs)
        splits = first_examples(family.read(cfg.task, cfg.data_source), sample_limits(cfg.task))
        tokenizer = load_tokenizer(cfg.model)
        # The local checkpoint and tokenizer by content (hashed once here, remembered in the
        # cache for the other processes and runs), for the report as data_fingerprint below.
        inputs = model_input_fingerprints(cfg.model, tokenizer, cfg.cache_dir)
        # Again with what only loading tells: a Hub checkpoint's config, a generated vocabulary.
        check_model_for_task(cfg.task, cfg.model, cfg.data_source, family, len(tokenizer),
                             local_only=False)
        data = family.featurize(cfg.task, splits, tokenizer, cfg.cache_dir,
                                cfg.preprocessing_num_workers)

    model = family.build_model(cfg.task, cfg.model, tokenizer, data)
    hyperparameters = {**paper_hyperparameters(setup.args, model, cfg.task.max_seq_length),
                       **family.hyperparameters(cfg.task, model), **toolbox.hyperparameters()}
    model = toolbox.apply(model)
    compiling = compile_if_it_pays(setup.compile, setup.args, len(data.features["train"]),
                                   cfg.task.max_seq_length)
    trainer = family.build_trainer(cfg.task, setup.args, model, tokenizer, data,
                                   setup.pad_to_multiple_of)
    if setup.static_shapes:  # every batch at its full rows: one graph per bucket
        use_padded_rows(trainer, family.padded_rows(cfg.task))
    toolbox.attach(trainer)
    run = train_run(cfg, setup, trainer, hyperparameters)

    toolbox.finish(trainer, setup.run_dir, run.main)  # LoRA: the merged model evaluated
    evaluation = family.evaluate(cfg.task, trainer, data, setup.run_dir, run.main)
    with saving_model(setup.run_dir / "model", run.main):
        family.save_model(trainer, setup.run_dir, run.main)
    record = metrics_record(
        header=result_header(cfg.recipe.name, cfg.task, cfg.model, family.name, trainer.args.seed,
                             main_value(evaluation, cfg.task.main_metric)),
        validation=evaluation.validation, test=evaluation.test,
        train=run.train_record(**family.train_sizes(data)),
        hyperparameters=run.hyperparameters, files=evaluation.files,
        # data_fingerprint and input_fingerprints: the content of the data, checkpoint and
        # tokenizer, so that the report tells runs on the same files apart from runs on other
        # files whatever path each was given (reporting.identity)
        details={"data_fingerprint": splits.fingerprint(), INPUT_FINGERPRINTS: inputs,
                 **data.facts,
                 # a run on the first N examples of a split is no result on the task
                 **({"limited_samples": splits.limited} if splits.limited else {}),
                 **evaluation.details, **(details or {}),
                 **({"compile": compiling.facts()} if compiling else {}),
                 **({"finetuning": facts} if (facts := toolbox.record()) else {})})
    final = {f"{split}/{metric}": value
             for split, scores in {**evaluation.validation, **evaluation.test}.items()
             for metric, value in scores.items()}
    final.update(toolbox.summary())  # the mix's learned weights, LoRA's share, ...
    publish(setup, run, Outcome(
        record, final, (record["main_metric"], record["main_value"]),
        lambda where: _printout(cfg.task, family, record, evaluation, trainer, setup.run_dir,
                                where)))
    push_if_asked(setup, trainer, record)
    return record


def sample_limits(task: DictConfig) -> dict[str, int | None]:
    """task.max_train_samples, max_eval_samples and max_predict_samples (None: all examples;
    a task conf of a user's that lacks them reads as None)."""
    return {key: task.get(key) for key in SAMPLE_LIMIT_KEYS.values()}


def compile_if_it_pays(settings: CompileSettings, args, train_rows: int,
                       max_seq_length: int) -> CompileRecord | None:
    """trainer.torch_compile decided for this run's length (static_shapes.decide_compile) and,
    compiled, Dynamo prepared for its graphs; returns what will record the compile's cost."""
    decide_compile(settings, args, planned_steps(args, train_rows, args.world_size))
    if not args.torch_compile:
        return None
    prepare_compile(settings, compile_graphs(max_seq_length, settings.bucket_width))
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
    width = max(len(name) + 1 for name in ["checkpoint", *evaluation.files])
    files = "".join(f"\n  {name + ':':<{width}} {path}" for name, path in evaluation.files.items())
    limited = record["details"].get("limited_samples", {})
    cut = (f"  first examples only (task.max_*_samples), no result on {task.name}: "
           + ", ".join(f"{split} {n['examples']} of {n['of']}" for split, n in limited.items())
           + "\n") if limited else ""
    return (f"\n{task.name}: {task.main_metric} = {record['main_value']:.4f} "
            f"({family.headline(record)})\n{cut}"
            f"  {'metrics:':<{width}} {run_dir / METRICS_FILE}{files}\n"
            f"  {'model:':<{width}} {run_dir / 'model'}\n"
            f"  {'checkpoint:':<{width}} {trainer.args.output_dir}\n"
            f"  {where}")
