"""The GLUE task family: sentence(-pair) classification and regression finetuning.

Reads the splits, tokenises them once, finetunes with Trainer, and leaves in the run
directory: config.yaml (resolved), metrics.json, predictions/<dev split>.tsv, the GLUE
leaderboard files of the test splits, and the final model.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from transformers import DataCollatorWithPadding, EvalPrediction, set_seed

from bertkit.data.atomic_files import write_json_atomic
from bertkit.tasks.glue.data import is_test_split, is_validation_split, load_glue_splits
from bertkit.tasks.glue.features import tokenize_splits
from bertkit.tasks.glue.metrics import check_metric_names, compute_metrics, predictions_from_logits
from bertkit.tasks.glue.predictions import write_dev_predictions, write_leaderboard_file
from bertkit.training.arguments import build_training_arguments
from bertkit.training.length_grouped_trainer import LengthGroupedTrainer
from bertkit.training.lifecycle import finish_wandb, report_to, result_header, train
from bertkit.training.models import load_sequence_classifier, load_tokenizer
from bertkit.training.wandb_logging import paper_hyperparameters

logger = logging.getLogger(__name__)


def _logits(output) -> np.ndarray:
    """The classifier's logits (models may return extra outputs after them)."""
    predictions = output.predictions
    return predictions[0] if isinstance(predictions, tuple) else predictions


def _run_dir() -> Path:
    return Path(HydraConfig.get().runtime.output_dir)


def finetune_glue(cfg: DictConfig, run_dir: Path | None = None) -> dict:
    run_dir = run_dir or _run_dir()
    task = cfg.task
    check_metric_names(task.metrics)
    labels = list(task.labels) if task.labels is not None else None
    regression = labels is None

    args = build_training_arguments(cfg, run_dir, report_to(cfg))
    set_seed(args.seed)

    with args.main_process_first(desc="reading and tokenizing the data"):
        raw = load_glue_splits(task, cfg.data_source)
        tokenizer = load_tokenizer(cfg.model)
        features = tokenize_splits(raw, tokenizer, max_seq_length=task.max_seq_length,
                                   cache_dir=cfg.cache_dir,
                                   num_proc=cfg.preprocessing_num_workers)
    validation_splits = [s for s in features if is_validation_split(s)]
    test_splits = [s for s in features if is_test_split(s)]
    model = load_sequence_classifier(cfg.model, tokenizer, labels)

    def metrics_of(prediction: EvalPrediction) -> dict:
        return compute_metrics(task.metrics,
                               predictions_from_logits(_logits(prediction), regression),
                               prediction.label_ids)

    pad_to = cfg.pad_to_multiple_of if (args.bf16 or args.fp16) else None
    trainer = LengthGroupedTrainer(
        model=model,
        args=args,
        train_dataset=features["train"],
        eval_dataset={split: features[split] for split in validation_splits},
        processing_class=tokenizer,
        data_collator=DataCollatorWithPadding(tokenizer, pad_to_multiple_of=pad_to),
        compute_metrics=metrics_of,
    )
    hyperparameters = paper_hyperparameters(args, model, task.max_seq_length)
    run = train(cfg, run_dir, trainer, hyperparameters)
    main = run.main

    results: dict[str, dict] = {}
    for split in validation_splits:
        output = trainer.predict(features[split], metric_key_prefix=f"eval_{split}")
        predicted = predictions_from_logits(_logits(output), regression)
        results[split] = compute_metrics(task.metrics, predicted, output.label_ids)
        if main:
            gold = np.asarray(features[split]["label"][:])
            write_dev_predictions(run_dir / "predictions" / f"{split}.tsv",
                                  features[split]["idx"][:], gold, predicted, labels)
    for split in test_splits:
        output = trainer.predict(features[split], metric_key_prefix=f"test_{split}")
        name = task.leaderboard_files.get(split, f"{task.name.upper()}-{split}.tsv")
        if main:
            write_leaderboard_file(run_dir / "leaderboard" / name, features[split]["idx"][:],
                                   predictions_from_logits(_logits(output), regression),
                                   labels)

    trainer.save_model(str(run_dir / "model"))
    if not main:
        return results
    summary = {
        **result_header(cfg, args.seed, results[validation_splits[0]][task.main_metric]),
        "validation": results,
        "train": run.train_record(examples=len(features["train"])),
        "hyperparameters": hyperparameters,
    }
    write_json_atomic(run_dir / "metrics.json", summary)
    where = finish_wandb(run, {f"{split}/{metric}": value for split, values in results.items()
                               for metric, value in values.items()},
                         hyperparameters["num_parameters"],
                         (summary["main_metric"], summary["main_value"]))
    scores = "; ".join(f"{split}: " + ", ".join(f"{k} {v:.4f}" for k, v in values.items())
                       for split, values in results.items())
    print(f"\n{task.name}: {task.main_metric} = {summary['main_value']:.4f} ({scores})\n"
          f"  metrics:    {run_dir / 'metrics.json'}\n"
          f"  model:      {run_dir / 'model'}\n"
          f"  checkpoint: {args.output_dir}\n"
          f"  {where}")
    return results
