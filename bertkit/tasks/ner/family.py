"""The NER task family: BertForTokenClassification on CoNLL-2003 (or any IOB-tagged data in the
CoNLL column format), or the paper's feature-based tagger on a frozen BERT.

Reads the splits (IOB1 or IOB2, kept as IOB2), builds word-aligned features once (cached),
finetunes with Trainer selecting checkpoints by entity F1, and leaves in the run directory:
config.yaml (resolved), metrics.json (entity precision/recall/F1, micro and per type, of the
validation and test splits), predictions/<split>.txt in the CoNLL evaluation's format, and the
final model.
"""

from __future__ import annotations

import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from transformers import DataCollatorForTokenClassification

from bertkit.data.task_data import TaskData, TaskSplits
from bertkit.errors import BertkitError
from bertkit.tasks.ner.data import load_ner_splits
from bertkit.tasks.ner.feature_based_tagger import FeatureBasedTagger, check_settings
from bertkit.tasks.ner.features import DECODING_COLUMNS, feature_splits
from bertkit.tasks.ner.metrics import (
    EntityScorer,
    argmax_tags,
    entity_scores,
    predict_tags,
    write_conll_predictions,
)
from bertkit.tasks.ner.models import load_tagger
from bertkit.training.finetune import Evaluation, TaskFamily
from bertkit.training.trainer import BertkitTrainer

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
    feature_based = OmegaConf.select(model, "feature_based")
    if feature_based is not None and feature_based.enabled:
        # A model from scratch says its depth here; a checkpoint's is checked once loaded.
        depth = None if model.name_or_path else OmegaConf.select(model,
                                                                  "config.num_hidden_layers")
        check_settings(feature_based.layers, feature_based.classifier, depth)


class NerFamily(TaskFamily):
    name = "ner"
    preparing = "reading the data and building features"

    def check(self, task, model) -> None:
        _check_task(task, model)

    def read(self, task, data_source) -> TaskSplits:
        return load_ner_splits(task, data_source)

    def featurize(self, task, splits, tokenizer, cache_dir, num_proc) -> TaskData:
        features, counts = feature_splits(
            splits, tokenizer, labels=_labels(task), max_seq_length=task.max_seq_length,
            label_all_subtokens=bool(task.label_all_subtokens),
            document_context=bool(task.document_context), cache_dir=cache_dir,
            num_proc=num_proc)
        return TaskData(splits, features, {"data": {
            split: {**counts[split], **splits.facts[split]} for split in splits}})

    def build_model(self, task, model, tokenizer, data):
        return load_tagger(model, tokenizer, _labels(task))

    def build_trainer(self, task, args, model, tokenizer, data, pad_to_multiple_of):
        return BertkitTrainer(
            model=model, args=args,
            train_dataset=data.features["train"].remove_columns(list(DECODING_COLUMNS)),
            eval_dataset=data.features["validation"], processing_class=tokenizer,
            data_collator=DataCollatorForTokenClassification(
                tokenizer, pad_to_multiple_of=pad_to_multiple_of),
            preprocess_logits_for_metrics=argmax_tags, scorer=EntityScorer(_labels(task)))

    def hyperparameters(self, task, model) -> dict:
        feature_based = isinstance(model, FeatureBasedTagger)
        settings = {
            "label_all_subtokens": bool(task.label_all_subtokens),
            "document_context": bool(task.document_context),
            "feature_based": dict(model.settings, enabled=True) if feature_based else
            {"enabled": False},
            "num_trainable_parameters": sum(p.numel() for p in model.parameters()
                                            if p.requires_grad),
        }
        if feature_based:  # the frozen encoder runs in eval mode: its dropout never applies
            settings.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        return settings

    def train_sizes(self, data) -> dict:
        return {"sentences": len(data.splits["train"]), "features": len(data.features["train"])}

    def evaluate(self, task, trainer, data, run_dir: Path, main: bool) -> Evaluation:
        """The final model (the best checkpoint's, with load_best_model_at_end) on the
        validation split and, when there is one, the test split."""
        results, files = {}, {}
        for split in (s for s in ("validation", "test") if s in data.features):
            gold, predicted, loop = predict_tags(trainer, data.features[split], f"eval_{split}")
            results[split] = {**entity_scores(gold, predicted, trainer.scorer.types),
                              "loss": loop.get(f"eval_{split}_loss")}
            if main:
                files[split] = str(write_conll_predictions(
                    run_dir / "predictions" / f"{split}.txt", data.splits[split]["tokens"][:],
                    gold, predicted))
        return Evaluation(validation={"validation": results["validation"]},
                          test={s: v for s, v in results.items() if s != "validation"},
                          files=files,
                          details={"best_checkpoint": trainer.state.best_model_checkpoint})

    def save_model(self, trainer, run_dir: Path, main: bool) -> None:
        trainer.save_model(str(run_dir / "model"))
        if main and isinstance(trainer.model, FeatureBasedTagger):
            trainer.model.save_settings(run_dir / "model", trainer.scorer.tag_names)

    def headline(self, summary: dict) -> str:
        return "; ".join(
            f"{split}: precision {values['precision']:.4f}, recall {values['recall']:.4f}, "
            f"f1 {values['f1']:.4f}"
            for split, values in {**summary["validation"], **summary["test"]}.items())


def _labels(task: DictConfig) -> list[str]:
    return [str(label) for label in task.labels]


FAMILY = NerFamily()
