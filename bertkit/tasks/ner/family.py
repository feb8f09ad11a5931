"""The NER task family: BertForTokenClassification on CoNLL-2003 (or any IOB-tagged data in the
CoNLL column format), or the paper's feature-based tagger on a frozen BERT.

Reads the splits (IOB1 or IOB2, kept as IOB2), builds word-aligned features once (cached),
finetunes with Trainer selecting checkpoints by entity F1, and leaves in the run directory:
config.yaml (resolved), metrics.json (entity precision/recall/F1, micro and per type, of the
validation and test splits), predictions/<split>.txt in the CoNLL evaluation's format, and the
final model.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from transformers import (
    AutoModel,
    AutoModelForTokenClassification,
    BertForTokenClassification,
    BertModel,
    DataCollatorForTokenClassification,
    PreTrainedTokenizerBase,
    set_seed,
)

from bertkit.data.atomic_files import write_json_atomic
from bertkit.errors import BertkitError
from bertkit.tasks.ner.data import load_ner_splits
from bertkit.tasks.ner.feature_based_tagger import FeatureBasedTagger, check_settings
from bertkit.tasks.ner.features import DECODING_COLUMNS, feature_splits
from bertkit.tasks.ner.files import check_tag_scheme
from bertkit.tasks.ner.metrics import entity_scores, write_conll_predictions
from bertkit.tasks.ner.trainer import TokenClassificationTrainer
from bertkit.training.arguments import build_training_arguments
from bertkit.training.lifecycle import finish_wandb, report_to, result_header, train
from bertkit.training.models import load_tokenizer, load_with_head
from bertkit.training.wandb_logging import paper_hyperparameters

logger = logging.getLogger(__name__)

_LABEL = re.compile(r"O|[BI]-\S+")


def _check_task(task: DictConfig, model: DictConfig) -> None:
    """Settings errors before any data is read."""
    labels = list(task.labels)
    bad = [label for label in labels if not _LABEL.fullmatch(str(label))]
    if bad or "O" not in labels or len(set(labels)) != len(labels):
        raise BertkitError(f"task.labels={labels}: expected distinct IOB2 tags, O and "
                           f"B-X / I-X for every entity type X")
    missing = [f"{prefix}-{label[2:]}" for label in labels for prefix in "BI"
               if label != "O" and f"{prefix}-{label[2:]}" not in labels]
    if missing:
        raise BertkitError(f"task.labels has no {', '.join(sorted(set(missing)))}: IOB2 needs "
                           f"B-X and I-X for every entity type X")
    check_tag_scheme(task.tag_scheme)
    if isinstance(task.max_seq_length, bool) or not isinstance(task.max_seq_length, int) \
            or task.max_seq_length < 3:
        raise BertkitError(f"task.max_seq_length={task.max_seq_length!r}: expected an integer "
                           f"of at least 3")
    feature_based = OmegaConf.select(model, "feature_based")
    if feature_based is not None and feature_based.enabled:
        # A model from scratch says its depth here; a checkpoint's is checked once loaded.
        depth = None if model.name_or_path else OmegaConf.select(model,
                                                                  "config.num_hidden_layers")
        check_settings(feature_based.layers, feature_based.classifier, depth)


def load_tagger(model: DictConfig, tokenizer: PreTrainedTokenizerBase, labels: list[str]):
    """BertForTokenClassification, or FeatureBasedTagger with model.feature_based.enabled."""
    feature_based = OmegaConf.select(model, "feature_based")
    if feature_based is not None and feature_based.enabled:
        encoder = load_with_head(model, tokenizer, AutoModel, BertModel, {})
        return FeatureBasedTagger(encoder, len(labels), layers=feature_based.layers,
                                  classifier=feature_based.classifier,
                                  lstm_hidden_size=feature_based.lstm_hidden_size,
                                  lstm_layers=feature_based.lstm_layers,
                                  dropout=feature_based.dropout)
    head = {"num_labels": len(labels), "id2label": dict(enumerate(labels)),
            "label2id": {label: i for i, label in enumerate(labels)}}
    return load_with_head(model, tokenizer, AutoModelForTokenClassification,
                          BertForTokenClassification, head)


def finetune_ner(cfg: DictConfig, run_dir: Path | None = None) -> dict:
    run_dir = Path(run_dir or HydraConfig.get().runtime.output_dir)
    task = cfg.task
    _check_task(task, cfg.model)  # before any data is read
    labels = [str(label) for label in task.labels]
    args = build_training_arguments(cfg, run_dir, report_to(cfg))
    set_seed(args.seed)

    with args.main_process_first(desc="reading the data and building features"):
        splits = load_ner_splits(task, cfg.data_source)
        tokenizer = load_tokenizer(cfg.model)
        features, counts = feature_splits(
            splits, tokenizer, labels=labels, max_seq_length=task.max_seq_length,
            label_all_subtokens=bool(task.label_all_subtokens),
            document_context=bool(task.document_context), cache_dir=cfg.cache_dir)
    evaluated = [split for split in ("validation", "test") if split in features]
    model = load_tagger(cfg.model, tokenizer, labels)
    pad_to = cfg.pad_to_multiple_of if (args.bf16 or args.fp16) else None
    trainer = TokenClassificationTrainer(
        model=model,
        args=args,
        train_dataset=features["train"].remove_columns(list(DECODING_COLUMNS)),
        eval_dataset=features["validation"],
        processing_class=tokenizer,
        data_collator=DataCollatorForTokenClassification(tokenizer, pad_to_multiple_of=pad_to),
        tag_names=labels,
    )
    feature_based = isinstance(model, FeatureBasedTagger)
    hyperparameters = {
        **paper_hyperparameters(args, model, task.max_seq_length),
        "label_all_subtokens": bool(task.label_all_subtokens),
        "document_context": bool(task.document_context),
        "feature_based": dict(model.settings, enabled=True) if feature_based else
        {"enabled": False},
        "num_trainable_parameters": sum(p.numel() for p in model.parameters()
                                        if p.requires_grad),
    }
    if feature_based:  # the frozen encoder runs in eval mode: its dropout never applies
        hyperparameters.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    run = train(cfg, run_dir, trainer, hyperparameters)
    main = run.main

    # The final model (the best checkpoint's, with load_best_model_at_end) on every split.
    results: dict[str, dict] = {}
    files: dict[str, str] = {}
    for split in evaluated:
        gold, predicted, loop = trainer.predict_tags(features[split], f"eval_{split}")
        results[split] = {**entity_scores(gold, predicted, trainer.types),
                          "loss": loop.get(f"eval_{split}_loss")}
        if main:
            path = write_conll_predictions(run_dir / "predictions" / f"{split}.txt",
                                           splits[split]["tokens"][:], gold, predicted)
            files[split] = str(path)
    trainer.save_model(str(run_dir / "model"))
    if feature_based and main:
        model.save_settings(run_dir / "model", labels)
    if not main:
        return results
    summary = {
        **result_header(cfg, args.seed, results["validation"][task.main_metric]),
        "validation": {"validation": results["validation"]},
        "test": {split: results[split] for split in evaluated if split != "validation"},
        "best_checkpoint": trainer.state.best_model_checkpoint,
        "files": files,
        "data": {split: {**counts[split], "tag_scheme": splits[split].bertkit_tag_scheme}
                 for split in splits},
        "train": run.train_record(sentences=len(splits["train"]),
                                  features=len(features["train"])),
        "hyperparameters": hyperparameters,
    }
    write_json_atomic(run_dir / "metrics.json", summary)
    where = finish_wandb(run, {f"{split}/{metric}": value for split, values in results.items()
                               for metric, value in values.items()},
                         hyperparameters["num_parameters"],
                         (summary["main_metric"], summary["main_value"]))
    scores = "; ".join(
        f"{split}: precision {values['precision']:.4f}, recall {values['recall']:.4f}, "
        f"f1 {values['f1']:.4f}" for split, values in results.items())
    print(f"\n{task.name}: {task.main_metric} = {summary['main_value']:.4f} ({scores})\n"
          f"  metrics:     {run_dir / 'metrics.json'}\n"
          f"  predictions: {run_dir / 'predictions'}\n"
          f"  model:       {run_dir / 'model'}\n"
          f"  {where}")
    return summary
