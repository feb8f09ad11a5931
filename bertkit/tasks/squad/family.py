"""The SQuAD task family: BertForQuestionAnswering on SQuAD v1.1 or v2.0.

Reads the splits, cuts them into windows once (cached), finetunes with Trainer, selects
checkpoints by the official F1, and leaves in the run directory: config.yaml (resolved),
metrics.json, predictions.json (question id -> answer, the official scripts' input), for
v2.0 null_odds.json (their --na-prob-file) and best_span_predictions.json, optionally
nbest_predictions.json, and the final model.

v2.0 scoring: the answer is "" when null odds (null score - best span score) exceed
task.null_score_diff_threshold. exact/f1/HasAns/NoAns are those of predictions.json;
best_exact/best_f1 sweep the threshold over the best non-null span of every question
(best_span_predictions.json), since a sweep over answers already replaced by "" could never
give them back. `evaluate-v2.0.py dev-v2.0.json predictions.json --na-prob-file
null_odds.json --na-prob-thresh T` (T the threshold, when above 1.0) reproduces the first,
and the same with best_span_predictions.json the second.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import datasets
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from transformers import DataCollatorWithPadding, set_seed

from bertkit.data.atomic_files import write_json_atomic
from bertkit.errors import BertkitError
from bertkit.tasks.squad.data import load_squad_splits
from bertkit.tasks.squad.decoding import SquadPredictions, decode_predictions
from bertkit.tasks.squad.features import DECODING_COLUMNS, check_window_settings, window_splits
from bertkit.tasks.squad.files import VERSIONS
from bertkit.tasks.squad.metrics import (
    squad_v1_scores,
    squad_v2_scores,
    write_null_odds_json,
    write_predictions_json,
)
from bertkit.tasks.squad.trainer import QuestionAnsweringTrainer
from bertkit.training.arguments import build_training_arguments
from bertkit.training.lifecycle import finish_wandb, report_to, result_header, train
from bertkit.training.models import load_question_answerer, load_tokenizer
from bertkit.training.wandb_logging import paper_hyperparameters

logger = logging.getLogger(__name__)


def answer_evaluator(task: DictConfig, examples: datasets.Dataset,
                     features: datasets.Dataset):
    """(start, end logits) -> (official scores, SquadPredictions with the final answers)."""
    version_2 = task.version == "v2.0"
    threshold = float(task.null_score_diff_threshold)

    def evaluate(start_logits, end_logits) -> tuple[dict, SquadPredictions]:
        # v2.0: decode every best non-null span (threshold +inf), then apply the threshold.
        decoded = decode_predictions(
            examples, features, start_logits, end_logits, n_best_size=task.n_best_size,
            max_answer_length=task.max_answer_length, version_2=version_2,
            null_score_diff_threshold=math.inf if version_2 else threshold,
            with_nbest=task.write_nbest)
        if not version_2:
            return squad_v1_scores(decoded.predictions, examples), decoded
        spans, odds = decoded.predictions, decoded.null_odds
        final = {qid: "" if odds[qid] > threshold else text for qid, text in spans.items()}
        # Scored on the spans with the threshold: the main scores equal those of `final`,
        # and the best-threshold sweep can still choose any span.
        scores = squad_v2_scores(spans, examples, odds, null_threshold=threshold)
        return scores, SquadPredictions(final, odds, decoded.nbest, spans)

    return evaluate


def _write_answers(run_dir: Path, answers: SquadPredictions) -> dict[str, str]:
    files = {"predictions": write_predictions_json(run_dir / "predictions.json",
                                                   answers.predictions)}
    if answers.null_odds is not None:
        files["null_odds"] = write_null_odds_json(run_dir / "null_odds.json", answers.null_odds)
        files["best_span_predictions"] = write_predictions_json(
            run_dir / "best_span_predictions.json", answers.spans)
    if answers.nbest is not None:
        files["nbest_predictions"] = write_json_atomic(run_dir / "nbest_predictions.json",
                                                       answers.nbest)
    return {name: str(path) for name, path in files.items()}


def _check_task(task: DictConfig) -> None:
    if task.version not in VERSIONS:
        raise BertkitError(f"task.version={task.version!r}: expected one of "
                           f"{', '.join(VERSIONS)}")
    check_window_settings(task.max_seq_length, task.doc_stride, task.max_query_length)
    for key in ("n_best_size", "max_answer_length"):
        if int(task[key]) < 1:
            raise BertkitError(f"task.{key}={task[key]}: expected a positive integer")


def finetune_squad(cfg: DictConfig, run_dir: Path | None = None) -> dict:
    run_dir = Path(run_dir or HydraConfig.get().runtime.output_dir)
    task = cfg.task
    _check_task(task)  # before any data is read
    args = build_training_arguments(cfg, run_dir, report_to(cfg))
    set_seed(args.seed)

    with args.main_process_first(desc="reading the data and cutting windows"):
        splits = load_squad_splits(task, cfg.data_source)
        tokenizer = load_tokenizer(cfg.model)
        train_windows, evaluation = window_splits(
            splits, tokenizer, max_seq_length=task.max_seq_length, doc_stride=task.doc_stride,
            max_query_length=task.max_query_length, cache_dir=cfg.cache_dir,
            num_proc=cfg.preprocessing_num_workers if cfg.preprocessing_num_workers > 1
            else None)
    examples = splits["validation"]
    model = load_question_answerer(cfg.model, tokenizer)
    pad_to = cfg.pad_to_multiple_of if (args.bf16 or args.fp16) else None
    trainer = QuestionAnsweringTrainer(
        model=model,
        args=args,
        train_dataset=train_windows,
        eval_dataset=evaluation.remove_columns(list(DECODING_COLUMNS)),
        processing_class=tokenizer,
        data_collator=DataCollatorWithPadding(tokenizer, pad_to_multiple_of=pad_to),
        evaluate_answers=answer_evaluator(task, examples, evaluation),
    )
    hyperparameters = {**paper_hyperparameters(args, model, task.max_seq_length),
                       "doc_stride": task.doc_stride, "max_query_length": task.max_query_length,
                       "n_best_size": task.n_best_size,
                       "max_answer_length": task.max_answer_length}
    run = train(cfg, run_dir, trainer, hyperparameters)
    main = run.main

    final = trainer.evaluate()  # the best checkpoint's, with load_best_model_at_end
    trainer.save_model(str(run_dir / "model"))
    if not main:
        return final
    scores = {name.removeprefix("eval_"): value for name, value in final.items()
              if not name.endswith(("_runtime", "_per_second", "_seconds"))
              and name != "epoch"}
    files = _write_answers(run_dir, trainer.last_answers)
    summary = {
        **result_header(cfg, args.seed, scores[task.main_metric]),
        "version": task.version,
        "validation": scores,
        "best_checkpoint": trainer.state.best_model_checkpoint,
        "evaluation": {"questions": len(examples), "windows": len(evaluation),
                       "decode_seconds": round(final["eval_decode_seconds"], 3),
                       "seconds": round(final["eval_runtime"], 2)},
        "files": files,
        "train": run.train_record(questions=len(splits["train"]), windows=len(train_windows)),
        "hyperparameters": hyperparameters,
    }
    write_json_atomic(run_dir / "metrics.json", summary)
    where = finish_wandb(run, scores, hyperparameters["num_parameters"],
                         (summary["main_metric"], summary["main_value"]))
    shown = ", ".join(f"{name} {scores[name]:.2f}" for name in scores
                      if name in ("exact_match", "exact", "f1", "best_f1", "best_f1_thresh"))
    print(f"\n{task.name}: {task.main_metric} = {summary['main_value']:.2f} ({shown}); "
          f"{len(examples)} questions decoded in {final['eval_decode_seconds']:.2f} s\n"
          f"  metrics:     {run_dir / 'metrics.json'}\n"
          f"  predictions: {files['predictions']}\n"
          f"  model:       {run_dir / 'model'}\n"
          f"  {where}")
    return summary
