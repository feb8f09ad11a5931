"""The SWAG task family: BertForMultipleChoice, four endings per example.

Reads the splits, encodes the four choices once (cached), finetunes with Trainer, and leaves
in the run directory: config.yaml (resolved), metrics.json, predictions/validation.tsv (per
example: gold, prediction, the four probabilities) and the final model. Accuracy is computed
from the logits (bertkit.tasks.swag.metrics), so it is the one the prediction file gives.
"""

from __future__ import annotations

import logging
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from transformers import (
    AutoModelForMultipleChoice,
    BertForMultipleChoice,
    DataCollatorForMultipleChoice,
    EvalPrediction,
    set_seed,
)

from bertkit.data.atomic_files import write_json_atomic
from bertkit.errors import BertkitError
from bertkit.tasks.swag.data import load_swag_splits
from bertkit.tasks.swag.features import check_max_seq_length, encode_splits
from bertkit.tasks.swag.files import NUM_CHOICES
from bertkit.tasks.swag.metrics import accuracy, choice_logits, write_predictions
from bertkit.training.arguments import build_training_arguments
from bertkit.training.length_grouped_trainer import LengthGroupedTrainer
from bertkit.training.lifecycle import finish_wandb, report_to, result_header, train
from bertkit.training.models import load_tokenizer, load_with_head
from bertkit.training.wandb_logging import paper_hyperparameters

logger = logging.getLogger(__name__)

METRICS = ("accuracy",)


def _check_task(task: DictConfig) -> None:
    check_max_seq_length(task.max_seq_length)
    if task.main_metric not in METRICS:
        raise BertkitError(f"task.main_metric={task.main_metric!r}: SWAG reports "
                           f"{', '.join(METRICS)}")


def finetune_swag(cfg: DictConfig, run_dir: Path | None = None) -> dict:
    run_dir = Path(run_dir or HydraConfig.get().runtime.output_dir)
    task = cfg.task
    _check_task(task)  # before any data is read
    args = build_training_arguments(cfg, run_dir, report_to(cfg))
    set_seed(args.seed)

    with args.main_process_first(desc="reading the data and encoding the choices"):
        splits = load_swag_splits(task, cfg.data_source)
        tokenizer = load_tokenizer(cfg.model)
        features = encode_splits(splits, tokenizer, max_seq_length=task.max_seq_length,
                                 cache_dir=cfg.cache_dir,
                                 num_proc=cfg.preprocessing_num_workers)
    model = load_with_head(cfg.model, tokenizer, AutoModelForMultipleChoice,
                           BertForMultipleChoice, {})

    def metrics_of(prediction: EvalPrediction) -> dict:
        return accuracy(choice_logits(prediction.predictions), prediction.label_ids)

    pad_to = cfg.pad_to_multiple_of if (args.bf16 or args.fp16) else None
    trainer = LengthGroupedTrainer(
        model=model,
        args=args,
        train_dataset=features["train"],
        eval_dataset=features["validation"],
        processing_class=tokenizer,
        data_collator=DataCollatorForMultipleChoice(tokenizer, pad_to_multiple_of=pad_to),
        compute_metrics=metrics_of,
    )
    hyperparameters = {**paper_hyperparameters(args, model, task.max_seq_length),
                       "num_choices": NUM_CHOICES}
    run = train(cfg, run_dir, trainer, hyperparameters)
    main = run.main

    output = trainer.predict(features["validation"], metric_key_prefix="eval_validation")
    logits = choice_logits(output.predictions)
    # Gold labels from the data, not from Trainer: accuracy is argmax(logits) against them.
    scores = accuracy(logits, features["validation"]["label"][:])
    trainer.save_model(str(run_dir / "model"))
    if not main:
        return scores
    predictions = write_predictions(run_dir / "predictions" / "validation.tsv",
                                    splits["validation"], logits)
    summary = {
        **result_header(cfg, args.seed, scores[task.main_metric]),
        "validation": scores,
        "files": {"predictions": str(predictions)},
        "train": run.train_record(examples=len(features["train"])),
        "hyperparameters": hyperparameters,
    }
    write_json_atomic(run_dir / "metrics.json", summary)
    where = finish_wandb(run, {f"validation/{name}": value for name, value in scores.items()},
                         hyperparameters["num_parameters"],
                         (summary["main_metric"], summary["main_value"]))
    print(f"\n{task.name}: {task.main_metric} = {summary['main_value']:.4f} "
          f"({scores['correct']} of {scores['examples']} validation examples)\n"
          f"  metrics:     {run_dir / 'metrics.json'}\n"
          f"  predictions: {predictions}\n"
          f"  model:       {run_dir / 'model'}\n"
          f"  checkpoint:  {args.output_dir}\n"
          f"  {where}")
    return summary
