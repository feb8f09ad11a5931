"""The bench_parity job: does bertkit's finetuning score what the plain Hugging Face recipe
(run_glue.py, written out below) scores on the same checkpoint, hyperparameters and seeds, and
how much faster does it get there? Seeds alternate between the ways, a finished seed is reused
by a rerun into the same directory, and Welch's test comes from bertkit-report's statistics.
docs/speed.md ("How bench-parity compares") says what is held equal. Writes
parity.json and prints a table."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import datasets
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from transformers import (
    AutoModelForSequenceClassification,
    DataCollatorWithPadding,
    PreTrainedTokenizerBase,
    Trainer,
    TrainingArguments,
    default_data_collator,
    set_seed,
)

from benchmarks.command import main
from benchmarks.measure import ratio, timed
from benchmarks.report import publish
from benchmarks.settings import check_settings
from benchmarks.side_by_side import alternating, release
from bertkit.data.atomic_files import read_json, write_json_atomic
from bertkit.errors import BertkitError
from bertkit.jobs import Job
from bertkit.reporting.statistics import (
    aso_epsilon,
    bootstrap_difference_ci,
    compare_groups,
    seeds_needed,
    summarize,
)
from bertkit.tasks.glue.data import is_validation_split
from bertkit.tasks.glue.family import FAMILY as GLUE
from bertkit.tasks.glue.family import logits_of
from bertkit.tasks.glue.metrics import predictions_from_logits, task_metrics
from bertkit.training.finetune import finetune
from bertkit.training.models import from_pretrained, load_tokenizer, trusts_remote_code
from bertkit.training.run import hydra_run_dir

RESULT_FILE = "parity.json"  # written last (JOB names it)

logger = logging.getLogger(__name__)

WAYS = ("plain", "bertkit")
PADDINGS = ("max_length", "longest")
COLLATORS = {"max_length": "default_data_collator", "longest": "DataCollatorWithPadding"}
DESCRIPTIONS = {
    "plain": "run_glue.py's recipe: padding={padding}, random batches, Trainer + "
             "{collator}, evaluation after training",
    # The batch order is bertkit's setting (length-grouped by default), so the record names it.
    "bertkit": "bertkit recipe=glue: dynamic padding, batches by "
               "trainer.train_sampling_strategy={sampling}, its finetune template",
}
# TrainingArguments of cfg.trainer that both ways take as they are (the hyperparameters); the
# rest (evaluation and saving during training, logging) is each way's own.
SHARED_ARGUMENTS = (
    "learning_rate", "per_device_train_batch_size", "per_device_eval_batch_size",
    "gradient_accumulation_steps", "num_train_epochs", "max_steps", "warmup_steps",
    "lr_scheduler_type", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon",
    "max_grad_norm", "optim", "dataloader_num_workers",
)


def _check(parity: DictConfig, task: DictConfig,
           model: DictConfig) -> tuple[list[int], list[str]]:
    seeds = [int(seed) for seed in parity.seeds]
    ways = [str(way) for way in parity.ways]
    if not ways or len(set(ways)) != len(ways) or not set(ways) <= set(WAYS):
        raise BertkitError(f"parity.ways={ways}: expected one or both of {', '.join(WAYS)}")
    comparing = len(ways) == len(WAYS)
    if not seeds or len(set(seeds)) != len(seeds) or (comparing and len(seeds) < 2):
        raise BertkitError(f"parity.seeds={seeds}: give at least 2 different seeds (Welch's "
                           f"test needs 2 runs per way; one way alone, parity.ways=[bertkit], "
                           f"trains any seeds)")
    if parity.baseline_padding not in PADDINGS:
        raise BertkitError(f"parity.baseline_padding={parity.baseline_padding}: expected "
                           f"one of {', '.join(PADDINGS)}")
    if (parity.baseline_padding == "max_length"
            and parity.baseline_max_length < task.max_seq_length):
        raise BertkitError(
            f"parity.baseline_max_length={parity.baseline_max_length} is below "
            f"task.max_seq_length={task.max_seq_length}: both ways truncate at "
            f"task.max_seq_length, and the plain way pads every example to baseline_max_length")
    if not model.name_or_path:
        raise BertkitError("bench_parity compares finetuning a checkpoint: model.name_or_path "
                           "is empty (pick model=minilm_l6 or a checkpoint directory)")
    return seeds, ways


def plain_features(split: datasets.Dataset, tokenizer: PreTrainedTokenizerBase,
                   max_seq_length: int, padding: DictConfig) -> datasets.Dataset:
    """run_glue.py's preprocess_function: one tokenizer call, truncated at max_seq_length
    (task.max_seq_length), padded to the fixed length (padding: the node with baseline_padding
    and baseline_max_length, parity.* here)."""
    pair = "text_b" in split.column_names

    def encode(batch: dict) -> dict:
        texts = (batch["text_a"], batch["text_b"]) if pair else (batch["text_a"],)
        # Truncated at task.max_seq_length as bertkit truncates, padded to baseline_max_length
        # (run_glue.py's max_seq_length: one call when the two are equal, as there).
        encoded = tokenizer(*texts, truncation=True, max_length=int(max_seq_length))
        if padding.baseline_padding == "max_length":
            encoded = tokenizer.pad(encoded, padding="max_length",
                                    max_length=int(padding.baseline_max_length))
        return {**encoded, "labels": batch["label"]}

    return split.map(encode, batched=True, remove_columns=split.column_names,
                     keep_in_memory=True, desc="Tokenizing (run_glue.py)")


def _plain_collator(padding: DictConfig, tokenizer: PreTrainedTokenizerBase):
    """run_glue.py's choice: examples padded already, or padded per batch by the collator."""
    if padding.baseline_padding == "max_length":
        return default_data_collator
    return DataCollatorWithPadding(tokenizer)


def _plain_run(task: DictConfig, model: DictConfig, trainer: DictConfig, parity: DictConfig,
               seed: int, run_dir: Path, splits, tokenizer: PreTrainedTokenizerBase) -> dict:
    (output, scores), seconds = timed(_plain_finetune, task, model, trainer, parity, seed,
                                      run_dir, splits, tokenizer, sync=False)
    validation_scores = {key[len("eval_"):]: float(value) for key, value in scores.items()
                         if key[len("eval_"):] in metric_names(task)}
    release(empty_cache=False)
    return {"validation": validation_scores, "seconds": seconds,
            "train_seconds": float(output.metrics["train_runtime"]),
            "training_loss": float(output.training_loss), "steps": int(output.global_step)}


def _plain_finetune(task: DictConfig, model: DictConfig, trainer: DictConfig,
                    parity: DictConfig, seed: int, run_dir: Path, splits,
                    tokenizer: PreTrainedTokenizerBase) -> tuple:
    """run_glue.py's model, data and Trainer: (its TrainOutput, its dev scores)."""
    plain = plain_trainer(task, model, trainer, parity, seed, run_dir, splits, tokenizer)
    return plain.train(), plain.evaluate()


def plain_trainer(task: DictConfig, model: DictConfig, trainer: DictConfig,
                  padding: DictConfig, seed: int, run_dir: Path, splits,
                  tokenizer: PreTrainedTokenizerBase, **arguments) -> Trainer:
    """run_glue.py's model, data and Trainer for one seed, with the trainer node's
    hyperparameters (SHARED_ARGUMENTS) and `arguments` (other TrainingArguments, e.g. its
    --bf16); padding: the node with baseline_padding and baseline_max_length (parity.*,
    bench_grid.*)."""
    labels = list(task.labels) if task.labels is not None else None
    set_seed(seed)
    head = {"num_labels": 1} if labels is None else {
        "num_labels": len(labels), "id2label": dict(enumerate(labels)),
        "label2id": {label: i for i, label in enumerate(labels)}}
    classifier = from_pretrained(
        AutoModelForSequenceClassification, str(model.name_or_path), "model.name_or_path",
        "model", trust_remote_code=trusts_remote_code(model),
        hidden_dropout_prob=model.hidden_dropout_prob,
        attention_probs_dropout_prob=model.attention_probs_dropout_prob, **head)
    train = plain_features(splits["train"], tokenizer, task.max_seq_length, padding)
    validation = plain_features(splits[dev_split(splits)], tokenizer, task.max_seq_length,
                                padding)
    shared = OmegaConf.to_container(trainer, resolve=True)
    args = TrainingArguments(
        output_dir=str(run_dir / "checkpoints"), seed=seed, report_to=[],
        eval_strategy="no", save_strategy="no", logging_strategy="no", disable_tqdm=True,
        dataloader_pin_memory=torch.cuda.is_available(),
        **{name: shared[name] for name in SHARED_ARGUMENTS if name in shared}, **arguments)
    metrics = task_metrics(task)

    def compute_metrics(prediction) -> dict:
        return metrics(predictions_from_logits(logits_of(prediction), labels is None),
                       prediction.label_ids)

    return Trainer(model=classifier, args=args, train_dataset=train, eval_dataset=validation,
                   processing_class=tokenizer, data_collator=_plain_collator(padding, tokenizer),
                   compute_metrics=compute_metrics)


def metric_names(task: DictConfig) -> set[str]:
    return {entry for entry in task.metrics if isinstance(entry, str)}


def dev_split(splits) -> str:
    return next(split for split in splits if is_validation_split(split))


def _bertkit_run(cfg: DictConfig, seed: int, run_dir: Path) -> dict:
    """The real `bertkit recipe=glue` finetune of this seed, in its own run directory."""
    run_cfg = OmegaConf.merge(cfg, {"seed": seed, "recipe": dict(cfg.parity.bertkit_recipe)})
    record, seconds = timed(finetune, run_cfg, GLUE, run_dir, sync=False)
    scores = next(iter(record["validation"].values()))
    return {"validation": {name: float(value) for name, value in scores.items()},
            "seconds": seconds, "train_seconds": float(record["train"]["seconds"]),
            "training_loss": float(record["train"]["loss"]),
            "steps": int(record["train"]["steps"]), "run_dir": str(run_dir)}


RUN_FILE = "parity_run.json"


def _settings(task: DictConfig, model: DictConfig, trainer: DictConfig,
              finetuning: DictConfig, parity: DictConfig) -> dict:
    """What a seed's result depends on besides the seed: a reused run must match it."""
    return {"task": task.name, "model": model.name_or_path,
            "hyperparameters": {name: OmegaConf.select(trainer, name)
                                for name in SHARED_ARGUMENTS},
            "train_sampling_strategy": trainer.train_sampling_strategy,
            "finetuning": OmegaConf.to_container(finetuning, resolve=True),
            "max_seq_length": int(task.max_seq_length),
            "baseline_max_length": int(parity.baseline_max_length),
            "baseline_padding": parity.baseline_padding}


def _finished_run(where: Path, settings: dict) -> dict | None:
    """The record of a run finished in an earlier launch, or None (never run, or cut short)."""
    path = where / RUN_FILE
    if not path.is_file():
        return None
    record = read_json(path)
    ran_under = record.pop("settings", None)
    if ran_under != settings:
        changed = sorted(key for key in settings if (ran_under or {}).get(key) != settings[key])
        raise BertkitError(
            f"{path} ran under other settings ({', '.join(changed)} differ from this launch): "
            f"pick another hydra.run.dir, or delete the file to train that seed again")
    return record


def _significance(parity: DictConfig, plain: list[float], bertkit: list[float]) -> dict:
    """Beyond Welch's test, as bertkit-report --compare gives it: ASO's ε_min each way (below
    0.2: that way is better), the bootstrap interval of bertkit − plain, and the seeds per way
    that would detect a difference of parity.max_difference at this spread."""
    confidence = 1 - float(parity.alpha)
    low, high = bootstrap_difference_ci(plain, bertkit, confidence)
    return {
        "aso_epsilon_bertkit_better": aso_epsilon(plain, bertkit, confidence=0.95),
        "aso_epsilon_plain_better": aso_epsilon(bertkit, plain, confidence=0.95),
        "bootstrap_low": low, "bootstrap_high": high, "confidence": confidence,
        "seeds_needed_per_way": seeds_needed(
            float(np.std(plain, ddof=1)), float(np.std(bertkit, ddof=1)),
            float(parity.max_difference), alpha=float(parity.alpha)),
        "detect": float(parity.max_difference),
    }


def _verdict(parity: DictConfig, comparison: dict) -> dict:
    """Parity: no significant difference at parity.alpha and means within parity.max_difference."""
    p_value, difference = comparison["p_value"], comparison["difference"]
    significant = not math.isnan(p_value) and p_value < parity.alpha
    close = abs(difference) <= parity.max_difference
    return {"at_parity": bool(close and not significant), "significant": bool(significant),
            "within_max_difference": bool(close), "alpha": float(parity.alpha),
            "max_difference": float(parity.max_difference)}


def benchmark_glue_parity(cfg: DictConfig, run_dir: Path | None = None) -> dict:
    check_settings(cfg)
    run_dir = Path(run_dir or hydra_run_dir())
    seeds, ways = _check(cfg.parity, cfg.task, cfg.model)
    GLUE.generate_data(cfg.task)
    splits = GLUE.read(cfg.task, cfg.data_source)
    tokenizer = load_tokenizer(cfg.model)
    main = cfg.task.main_metric
    runs: dict[str, dict[int, dict]] = {way: {} for way in WAYS}
    settings = _settings(cfg.task, cfg.model, cfg.trainer, cfg.finetuning, cfg.parity)
    for position, seed in enumerate(seeds):
        for way in alternating(WAYS, position):
            if way not in ways:
                continue
            where = run_dir / way / f"seed_{seed}"
            runs[way][seed] = _finished_run(where, settings)
            if runs[way][seed] is not None:
                logger.info("bench_parity %s seed %d: reused %s", way, seed, where / RUN_FILE)
                continue
            logger.info("bench_parity %s: seed %d", way, seed)
            runs[way][seed] = (_plain_run(cfg.task, cfg.model, cfg.trainer, cfg.parity, seed,
                                          where, splits, tokenizer) if way == "plain"
                               else _bertkit_run(cfg, seed, where))
            write_json_atomic(where / RUN_FILE, {"settings": settings, **runs[way][seed]})
            logger.info("bench_parity %s seed %d: %s=%.4f in %.0f s", way, seed, main,
                        runs[way][seed]["validation"][main], runs[way][seed]["seconds"])
    if len(ways) < len(WAYS):
        logger.info("bench_parity: trained parity.ways=%s only; launch again with both ways into "
                    "%s for the comparison (parity.json)", ways, run_dir)
        return {"seeds": seeds, "ways": ways, "runs": runs}
    result = _result(cfg.task, cfg.model, cfg.trainer, cfg.parity, seeds, runs)
    publish(result, run_dir / RESULT_FILE, _table)
    return result


def _result(task: DictConfig, model: DictConfig, trainer: DictConfig, parity: DictConfig,
            seeds: list[int], runs: dict) -> dict:
    main = task.main_metric
    scores = {way: [runs[way][seed]["validation"][main] for seed in seeds] for way in WAYS}
    comparison = compare_groups(scores["plain"], scores["bertkit"])  # bertkit - plain
    seconds = {way: math.fsum(runs[way][seed]["seconds"] for seed in seeds) for way in WAYS}
    return {
        "task": task.name,
        "model": model.name_or_path,
        "main_metric": main,
        "seeds": seeds,
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "torch_threads": torch.get_num_threads(),
        "hyperparameters": {name: OmegaConf.select(trainer, name) for name in SHARED_ARGUMENTS},
        "max_seq_length": int(task.max_seq_length),
        "baseline_max_length": int(parity.baseline_max_length),
        "baseline_padding": parity.baseline_padding,
        "ways": {way: {"description": DESCRIPTIONS[way].format(
                           sampling=trainer.train_sampling_strategy,
                           padding=parity.baseline_padding,
                           collator=COLLATORS[parity.baseline_padding]),
                       "main": summarize(scores[way]),
                       "per_seed": {str(seed): runs[way][seed] for seed in seeds},
                       "seconds": seconds[way]} for way in WAYS},
        "comparison": comparison,
        "significance": _significance(parity, scores["plain"], scores["bertkit"]),
        "verdict": _verdict(parity, comparison),
        "time_ratio": ratio(seconds["plain"], seconds["bertkit"]),
        "timing": "wall time of each whole run (model load, tokenisation, training, dev "
                  "evaluation and each way's own saving), summed over seeds; ratio plain/bertkit",
    }


def _table(result: dict, path: Path) -> str:
    main, ways, comparison = result["main_metric"], result["ways"], result["comparison"]
    verdict, significance = result["verdict"], result["significance"]
    lines = [f"\nbench_parity {result['task']} ({main}, {len(result['seeds'])} seeds, "
             f"{result['device']}): {result['model']}",
             f"  {'way':<8} {'mean':>7} {'std':>7} {'min':>7} {'max':>7} {'seconds':>9}"]
    for way, values in ways.items():
        stats = values["main"]
        lines.append(f"  {way:<8} {100 * stats['mean']:>7.2f} {100 * stats['std']:>7.2f} "
                     f"{100 * stats['min']:>7.2f} {100 * stats['max']:>7.2f} "
                     f"{values['seconds']:>9.0f}")
    lines += [
        f"  bertkit - plain: {100 * comparison['difference']:+.2f} points, "
        f"{int(100 * comparison['confidence'])}% CI [{100 * comparison['ci_low']:+.2f}, "
        f"{100 * comparison['ci_high']:+.2f}], Welch p = {comparison['p_value']:.3f}",
        f"  ASO eps_min: bertkit better {significance['aso_epsilon_bertkit_better']:.2f}, "
        f"plain better {significance['aso_epsilon_plain_better']:.2f} (below 0.2: better); "
        f"bootstrap CI [{100 * significance['bootstrap_low']:+.2f}, "
        f"{100 * significance['bootstrap_high']:+.2f}]; seeds per way to detect "
        f"{100 * significance['detect']:.1f} points: {significance['seeds_needed_per_way']}",
        f"  at parity: {'yes' if verdict['at_parity'] else 'no'} "
        f"(p >= {verdict['alpha']} and |difference| <= {100 * verdict['max_difference']:.1f} "
        f"points)",
        f"  wall time plain/bertkit: {result['time_ratio']:.2f}x",
        f"  result: {path}",
    ]
    return "\n".join(lines)


# What `python -m benchmarks.glue_parity` runs: its job on its primary config,
# benchmarks/conf/bench_parity.yaml.
CONFIG = "bench_parity"
JOB = Job("benchmarks.glue_parity:benchmark_glue_parity", RESULT_FILE, reuses_its_runs=True)

if __name__ == "__main__":
    main(JOB, CONFIG)
