"""Held-out masked-LM quality: one set of masked positions that every arm of a pretraining
comparison is scored on.

A training log's MLM loss is measured on the arm's own training masks, so static and dynamic
masking, MLM alone and MLM + NSP, or a plain Hugging Face run are not scored on the same
thing. Here a share of the corpus's documents is held out from training (whole documents,
chosen by a hash of their text: the same whatever the document order, seed or arm), packed
and masked once with a fixed rule and seed, and every model is scored on exactly those
positions. For objectives with a sentence task, a held-out pair set scores NSP/SOP as well.

Usable outside the pretraining job (a benchmark's plain BertForMaskedLM):

    train_docs, heldout_docs = split_documents(documents, cfg.heldout.fraction,
                                               cfg.heldout.min_documents)
    heldout = build_heldout(cfg.heldout, cfg.pretraining, cfg.objective, tokenizer,
                            heldout_docs)
    scores = score_heldout(model, heldout.mlm, heldout_collator(tokenizer),
                           cfg.heldout.batch_size)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import datasets
import numpy as np
import torch
from omegaconf import DictConfig
from torch.nn import functional
from transformers import PreTrainedTokenizerBase, Trainer, TrainerCallback

from bertkit.errors import BertkitError
from bertkit.pretraining.masking import (
    IGNORE_INDEX,
    Vocabulary,
    masking_rule_from_config,
    padding_collator,
    static_masked_copies,
)
from bertkit.pretraining.objective import (
    objective_of,
    packed_sequences_dataset,
    registered,
    tokenize_documents,
)
from bertkit.training.stop_and_resume import TrainingClock, preempting
from bertkit.training.throughput import excluded_from_throughput

KEY_COLUMN = "heldout_key"
KEY_BITS = 52  # a float64 holds a 52-bit integer over 2**52 exactly, so keys stay below 1
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
STATISTICS = ("mlm_loss_sum", "mlm_correct", "mlm_count", "sentence_loss_sum",
              "sentence_correct", "sentence_count")
MASKING_KEYS = ("mlm_probability", "mask_token_fraction", "random_token_fraction",
                "max_predictions_per_seq", "unit", "span_geometric_p", "span_max_words",
                "convention")


# Settings


def heldout_enabled(heldout: DictConfig) -> bool:
    return heldout.fraction > 0


def check_heldout_config(heldout: DictConfig) -> None:
    """The rules between heldout.* settings, before any data is read (each value's type and
    range is the schema's: bertkit.config_schema.HeldoutSchema)."""
    if not heldout_enabled(heldout):
        return
    seconds, steps = heldout.get("every_seconds"), heldout.get("every_steps")
    if (seconds is None) == (steps is None):
        raise BertkitError(f"heldout.every_seconds={seconds!r} and heldout.every_steps="
                           f"{steps!r}: give exactly one of them (the other null)")
    heldout_rule(heldout)


def heldout_rule(heldout: DictConfig):
    """heldout.masking as a MaskingRule; its errors name the heldout.masking keys."""
    masking = heldout.get("masking")
    missing = [key for key in MASKING_KEYS if masking is None or key not in masking]
    if missing:
        raise BertkitError(f"heldout.masking: missing {', '.join(missing)} (the held-out masks' "
                           f"own rule, independent of the arm's masking group)")
    try:
        return masking_rule_from_config(masking)
    except BertkitError as err:  # "masking.<key>=...": the held-out rule's key
        raise BertkitError(f"heldout.{err}") from None


# The split


def _document_keys(batch: dict) -> dict:
    """Each document's place in [0, 1): sha256 of its sentences joined by newlines."""
    keys = []
    for sentences in batch["sentences"]:
        digest = hashlib.sha256("\n".join(sentences).encode("utf-8")).digest()
        keys.append((int.from_bytes(digest[:8], "big") >> (64 - KEY_BITS)) / 2.0 ** KEY_BITS)
    return {KEY_COLUMN: keys}


def document_keys(documents: datasets.Dataset, num_proc: int | None = None) -> np.ndarray:
    """The documents' hash keys, in their order (a datasets.map: cached with the corpus)."""
    keyed = documents.map(_document_keys, batched=True, num_proc=num_proc,
                          remove_columns=documents.column_names, desc="Hashing documents")
    return np.asarray(keyed[KEY_COLUMN], dtype=np.float64)


def split_documents(documents: datasets.Dataset, fraction: float, min_documents: int = 1,
                    num_proc: int | None = None
                    ) -> tuple[datasets.Dataset, datasets.Dataset | None]:
    """(training documents, held-out documents): whole documents whose hash key is below
    `fraction`, so the same text is held out whatever the order, seed or arm (identical
    documents share a key: never one copy on each side). When the fraction selects fewer than
    `min_documents`, the smallest keys are held out up to that number, leaving training at
    least 2 documents where the corpus has them (NSP needs 2 on each side), so a tiny corpus
    still has a held-out set. fraction=0: (documents, None)."""
    if fraction <= 0:
        return documents, None
    if not isinstance(documents, datasets.Dataset):
        raise BertkitError("heldout.fraction>0 needs the corpus as a stored dataset, not a "
                           "stream: set heldout.fraction=0 or corpus.hub.streaming=false")
    keys = document_keys(documents, num_proc)
    held = keys < fraction
    if held.sum() < min_documents:
        if len(keys) < 2:
            raise BertkitError(f"heldout.fraction={fraction}: the corpus has {len(keys)} "
                               f"document, none to spare for a held-out set; set "
                               f"heldout.fraction=0 (or use a larger corpus)")
        quota = max(1, min(min_documents, len(keys) - 2))
        held = keys <= np.sort(keys)[quota - 1]
    if held.all():
        raise BertkitError(f"heldout.fraction={fraction}: every document of the corpus would "
                           f"be held out; lower heldout.fraction")
    return (documents.select(np.flatnonzero(~held)), documents.select(np.flatnonzero(held)))


def check_corpus_size(documents: int, objective: DictConfig, fraction: float) -> None:
    """Before the split: one line naming the setting that works when a corpus of `documents`
    cannot give the objective's training, and the held-out set, what they need. The split
    itself does not depend on the objective (every arm holds out the same documents), so a
    corpus too small for both is refused here rather than split per objective."""
    chosen = objective_of(objective)
    needed = chosen.documents_needed
    plural = "s" if documents != 1 else ""
    if documents < needed:
        also = " heldout.fraction=0" if fraction > 0 else ""
        instead = chosen.fewer_documents
        advice = (f"objective={instead}{also} trains on it ({registered()[instead].summary})"
                  if instead else "use a larger corpus")
        raise BertkitError(
            f"objective={chosen.name}: {chosen.title} needs at least {needed} documents "
            f"({chosen.documents_reason}), the corpus has {documents}: {advice}")
    if fraction > 0 and documents < 2 * needed:
        raise BertkitError(
            f"heldout.fraction={fraction}: the corpus has {documents} document{plural}, and "
            f"objective={chosen.name} needs {needed} to train on and {needed} held out: "
            f"heldout.fraction=0 trains on {'it' if documents == 1 else f'all {documents}'} "
            f"(no held-out scores)")


def check_training_share(train: int, held: int, objective: DictConfig,
                         fraction: float) -> None:
    """After the split: a large heldout.fraction may leave training fewer than it needs."""
    chosen = objective_of(objective)
    if train < chosen.documents_needed:
        raise BertkitError(
            f"heldout.fraction={fraction} holds out {held} of the corpus's {train + held} "
            f"documents, leaving training {train}; objective={chosen.name} needs "
            f"{chosen.documents_needed}: lower heldout.fraction")


# The held-out sets


@dataclass
class HeldoutSet:
    """The masked sets every arm is scored on: `mlm` (full-sentence packed sequences) and, for
    a sentence task, `pairs` (NSP/SOP instances). Columns input_ids, attention_mask,
    token_type_ids, labels (-100 where nothing is predicted), and next_sentence_label."""

    mlm: datasets.Dataset
    pairs: datasets.Dataset | None
    sentence_task: str | None
    documents: int


def _with_attention_mask(batch: dict) -> dict:
    return {"attention_mask": [[1] * len(ids) for ids in batch["input_ids"]]}


def _masked(instances: datasets.Dataset, max_sequences: int, vocab: Vocabulary, rule,
            seed: int) -> datasets.Dataset:
    """The first max_sequences instances, masked once (static masking's code, one copy)."""
    first = instances.select(range(min(len(instances), max_sequences)))
    masked = static_masked_copies(first, vocab, rule, dupe_factor=1, seed=seed)
    masked = masked.map(_with_attention_mask, batched=True, desc="Held-out attention masks")
    return masked.remove_columns("length")


def build_heldout(heldout: DictConfig, pretraining: DictConfig, objective_cfg: DictConfig,
                  tokenizer: PreTrainedTokenizerBase,
                  heldout_docs: datasets.Dataset) -> HeldoutSet:
    """The held-out sets from split_documents' held-out documents. They depend on the
    documents, the tokenizer, pretraining.max_seq_length (and short_seq_prob for pairs),
    objective.sentence_task and heldout.* only: not on the arm's masking, seed or process
    count (packing and masking run in one process, each row seeded by heldout.seed). A
    sentence task is scored on the objective's own instances of the held-out documents.
    heldout: the heldout node, pretraining and objective_cfg: those nodes."""
    rule, vocab = heldout_rule(heldout), Vocabulary.from_tokenizer(tokenizer)
    length = pretraining.max_seq_length
    tokenized = tokenize_documents(heldout_docs, tokenizer)
    packed = packed_sequences_dataset(tokenized, tokenizer, max_seq_length=length)
    if len(packed) == 0:
        raise BertkitError(f"heldout: the {len(heldout_docs)} held-out documents hold no "
                           f"sentence to score; raise heldout.fraction or set it to 0")
    mlm = _masked(packed, heldout.max_sequences, vocab, rule, heldout.seed)
    objective = objective_of(objective_cfg)
    sentence_task = objective.sentence_task
    pairs = None
    if sentence_task is not None and len(heldout_docs) < objective.documents_needed:
        raise BertkitError(f"heldout: {sentence_task.upper()}'s held-out pairs need "
                           f"{objective.documents_needed} held-out documents "
                           f"({objective.documents_reason}), the corpus spared "
                           f"{len(heldout_docs)}; raise heldout.fraction or heldout.min_documents, "
                           f"or set heldout.fraction=0")
    if sentence_task is not None:  # scored on the objective's own instances, held out
        instances = objective.instances(
            tokenized, tokenizer, max_seq_length=length,
            short_seq_prob=pretraining.short_seq_prob, seed=heldout.seed, copies=1)
        if len(instances) == 0:
            raise BertkitError(f"heldout: the {len(heldout_docs)} held-out documents give no "
                               f"{sentence_task.upper()} pair; raise heldout.fraction")
        pairs = _masked(instances, heldout.max_sequences, vocab, rule, heldout.seed)
    return HeldoutSet(mlm, pairs, sentence_task, len(heldout_docs))


def heldout_fingerprint(dataset: datasets.Dataset) -> str:
    """sha256 over every row's input_ids, token_type_ids, labels (and next_sentence_label):
    equal fingerprints, equal sets, whichever run or arm built them."""
    digest = hashlib.sha256()
    columns = [name for name in ("input_ids", "token_type_ids", "labels",
                                 "next_sentence_label") if name in dataset.column_names]
    for batch in dataset.select_columns(columns).iter(batch_size=1000):
        for values in zip(*(batch[name] for name in columns), strict=True):
            for value in values:
                row = np.asarray(value, dtype=np.int64).reshape(-1)
                digest.update(np.int64(row.size).tobytes() + row.tobytes())
    return digest.hexdigest()[:16]


def describe_set(dataset: datasets.Dataset) -> dict:
    """sequences, real tokens, masked positions and fingerprint (for metrics.json)."""
    labels = dataset["labels"]
    return {"sequences": len(dataset),
            "real_tokens": int(sum(len(row) for row in labels)),
            "masked_positions": int(sum(int((np.asarray(row) != IGNORE_INDEX).sum())
                                        for row in labels)),
            "fingerprint": heldout_fingerprint(dataset)}


def majority_label_share(dataset: datasets.Dataset) -> float:
    """The NSP/SOP accuracy of always predicting the commoner label: the bar a sentence head
    must clear before its held-out accuracy means it learned anything."""
    labels = np.asarray(dataset["next_sentence_label"])
    return float(max(labels.mean(), 1 - labels.mean()))


# Scoring


def heldout_collator(tokenizer: PreTrainedTokenizerBase):
    """Pads each batch of a held-out set (labels with -100); padding does not change scores."""
    return padding_collator(tokenizer, None)


def _logit_statistics(model, batch: dict) -> dict:
    """Any transformers BERT with an MLM head (BertForMaskedLM, BertForPreTraining): the
    vocabulary logits of every position, cross-entropy on the labelled ones."""
    output = model(**{name: batch[name] for name in MODEL_INPUTS if name in batch})
    logits = output.get("prediction_logits")
    if logits is None:
        logits = output.logits
    labels = batch["labels"]
    masked = labels != IGNORE_INDEX
    chosen, targets = logits[masked].float(), labels[masked]
    statistics = {"mlm_loss_sum": functional.cross_entropy(chosen, targets, reduction="sum"),
                  "mlm_correct": (chosen.argmax(-1) == targets).sum(),
                  "mlm_count": masked.sum()}
    sentence_logits = output.get("seq_relationship_logits")
    if sentence_logits is not None and "next_sentence_label" in batch:
        sentence, target = sentence_logits.float(), batch["next_sentence_label"]
        statistics.update(
            sentence_loss_sum=functional.cross_entropy(sentence, target, reduction="sum"),
            sentence_correct=(sentence.argmax(-1) == target).sum(),
            sentence_count=torch.tensor(target.numel()))
    return statistics


def _batch_statistics(model, batch: dict) -> dict:
    if getattr(model, "mlm_on_labelled_positions_only", False):
        # bertkit's pretraining model computes these sums itself, on the masked positions.
        output = model(**batch)
        return {name: getattr(output, name) for name in STATISTICS
                if getattr(output, name, None) is not None}
    return _logit_statistics(model, batch)


def score_heldout(model, dataset: datasets.Dataset, collator, batch_size: int,
                  sentence_task: str | None = None) -> dict:
    """mlm_loss (sum of the token losses over the number of masked positions of the whole set,
    not a mean of batch means), mlm_accuracy, masked_positions, sequences; for a set with
    next_sentence_label and a model with a sentence head, <sentence_task>_loss and
    _accuracy too. In eval mode without gradients; the model's mode is restored after."""
    if batch_size < 1:
        raise BertkitError(f"heldout.batch_size={batch_size}: expected a positive integer")
    device = next(model.parameters()).device
    totals = dict.fromkeys(STATISTICS, 0.0)
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, len(dataset), batch_size):
                rows = dataset.select(range(start, min(start + batch_size, len(dataset))))
                batch = {name: value.to(device)
                         for name, value in collator(rows.to_list()).items()}
                for name, value in _batch_statistics(model, batch).items():
                    totals[name] += float(value)
    finally:
        model.train(training)
    count = max(totals["mlm_count"], 1.0)
    scores = {"mlm_loss": totals["mlm_loss_sum"] / count,
              "mlm_accuracy": totals["mlm_correct"] / count,
              "masked_positions": int(totals["mlm_count"]), "sequences": len(dataset)}
    if totals["sentence_count"]:
        name = sentence_task or "sentence"
        scores[f"{name}_loss"] = totals["sentence_loss_sum"] / totals["sentence_count"]
        scores[f"{name}_accuracy"] = totals["sentence_correct"] / totals["sentence_count"]
    return scores


# The held-out score during pretraining: at step 0, every heldout.every_seconds of training
# time (or every_steps), and at the end, each evaluation a `heldout/*` line of the log history
# (a resumed run does not score where it resumes: its curve is the uninterrupted run's).
#
# Evaluations run with the training clock paused and outside the throughput meter's windows, so
# measuring a run does not change how much it trains. The lines go through trainer.log: W&B
# gets them against the step (under train/heldout/...), and trainer_state.json keeps them, so a
# resumed run's curve still holds the evaluations made before the resume. Every process
# evaluates (no collective call; the set is small); only the main process writes files. After a
# preemption signal nothing is scored (bertkit.training.stop_and_resume): the run saves and exits
# within the scheduler's grace period, and the resumed run scores at its end.


PREFIX = "heldout/"
LOSS_KEY = f"{PREFIX}mlm_loss"  # the key that marks a held-out line in the log history
STEP, TOKENS, ELAPSED = "step", "tokens_seen", "elapsed_seconds"


def evaluate_heldout(model, heldout: HeldoutSet, collator, batch_size: int) -> dict:
    """The MLM scores on the MLM set; the sentence task's on the pair set."""
    scores = score_heldout(model, heldout.mlm, collator, batch_size)
    result = {"mlm_loss": scores["mlm_loss"], "mlm_accuracy": scores["mlm_accuracy"]}
    if heldout.pairs is not None:
        task = heldout.sentence_task
        pairs = score_heldout(model, heldout.pairs, collator, batch_size, sentence_task=task)
        result.update({key: pairs[key] for key in (f"{task}_loss", f"{task}_accuracy")
                       if key in pairs})
    return result


class HeldoutEvaluation(TrainerCallback):
    def __init__(self, trainer: Trainer, heldout: HeldoutSet, clock: TrainingClock, *,
                 batch_size: int, every_seconds: float | None = None,
                 every_steps: int | None = None, tokenizer=None):
        """tokenizer (for padding): the trainer's processing_class unless given."""
        tokenizer = tokenizer if tokenizer is not None else trainer.processing_class
        if tokenizer is None:
            raise BertkitError("HeldoutEvaluation needs a tokenizer to pad the held-out "
                               "batches: give tokenizer=, or the Trainer a processing_class")
        if (every_seconds is None) == (every_steps is None):
            raise BertkitError("HeldoutEvaluation: give exactly one of every_seconds and "
                               "every_steps")
        self.trainer = trainer
        self.heldout = heldout
        self.clock = clock
        self.batch_size = batch_size
        self.every_seconds = every_seconds
        self.every_steps = every_steps
        self.collator = heldout_collator(tokenizer)
        self._last_step: int | None = None
        self._last_elapsed = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        scored = [line for line in state.log_history if LOSS_KEY in line]
        if scored:  # a resumed run: its earlier evaluations are in the log history
            self._last_step = scored[-1][STEP]
            self._last_elapsed = scored[-1][PREFIX + ELAPSED]
        # At step 0 only: a resumed run's curve is the uninterrupted run's, the next
        # evaluation due on the clock or step count carried over.
        if state.global_step == 0 and self._last_step != 0:
            self._evaluate(state)
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if self._due(state):
            # trainer.log resets control.should_log (CallbackHandler.on_log): keep Trainer's
            # own training log line of this step, due right after the callbacks.
            should_log = control.should_log
            self._evaluate(state)
            control.should_log = should_log
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self._last_step != state.global_step and not preempting(self.trainer):
            self._evaluate(state)
        return control

    def _due(self, state) -> bool:
        if self._last_step == state.global_step or preempting(self.trainer):
            return False
        if self.every_steps is not None:
            return state.global_step % self.every_steps == 0
        return self.clock.elapsed() - self._last_elapsed >= self.every_seconds

    def _evaluate(self, state) -> None:
        elapsed = self.clock.elapsed()  # training time up to here; the evaluation is paused
        with self.clock.paused(), excluded_from_throughput(self.trainer):
            scores = evaluate_heldout(self.trainer.model, self.heldout, self.collator,
                                      self.batch_size)
        self._last_step, self._last_elapsed = state.global_step, elapsed
        flush = getattr(self.trainer, "flush_step_counters", None)
        if flush is not None:  # the tokens counted on the device, into the state
            flush()
        self.trainer.log({**{PREFIX + key: value for key, value in scores.items()},
                          PREFIX + TOKENS: state.num_input_tokens_seen,
                          PREFIX + ELAPSED: elapsed})


def heldout_curve(log_history: list[dict]) -> list[dict]:
    """Every held-out evaluation of the log history: step, tokens_seen, elapsed_seconds and
    the scores, without the prefix."""
    return [{STEP: line[STEP], **{key[len(PREFIX):]: value for key, value in line.items()
                                  if key.startswith(PREFIX)}}
            for line in log_history if LOSS_KEY in line]


def heldout_record(heldout: HeldoutSet, train_documents: int, log_history: list[dict],
                   settings) -> dict:
    """metrics.json's "heldout": the sets (sizes, fingerprints), the curve and the final
    evaluation."""
    curve = heldout_curve(log_history)
    pairs = None
    if heldout.pairs is not None:
        pairs = {"sentence_task": heldout.sentence_task, **describe_set(heldout.pairs),
                 "majority_accuracy": majority_label_share(heldout.pairs)}
    return {"fraction": settings.fraction, "seed": settings.seed,
            "documents": heldout.documents, "train_documents": train_documents,
            **describe_set(heldout.mlm), "pairs": pairs,
            "curve": curve, "final": curve[-1] if curve else None}
