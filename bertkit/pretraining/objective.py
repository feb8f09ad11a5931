"""The pretraining objectives in one plain table, OBJECTIVES: masked LM alone (mlm), with next
sentence prediction (mlm_nsp, the paper's) or with sentence order prediction (sop). Each is an
Objective, picked by a preset conf/objective/<name>.yaml (`objective=<name>`); the rest of
pretraining asks the objective what it does (its instances, its sentence task, the documents
it needs) instead of comparing its name. Adding an objective: a class here, its line in
OBJECTIVES and a preset (or, outside bertkit, a class decorated with @register).

The preset's keys stay what users override and runs record (objective.name,
objective.sentence_task, objective.packing); they are the class's, and a value the class does
not have is refused naming the key.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import datasets
from omegaconf import DictConfig
from transformers import PreTrainedTokenizerBase

from bertkit.errors import BertkitError
from bertkit.pretraining.instances import (
    PAIR_COLUMNS,
    add_pair_rows,
    packed_columns,
    packed_sequences_dataset,
    pair_instances_dataset,
)

# The preset's keys besides name that say what the objective is (recorded in config.yaml).
DESCRIBED_BY = ("sentence_task", "packing")


class Objective:
    """What differs between pretraining objectives. Stateless: an instance per lookup."""

    name: str = ""  # objective.name and objective=<name>: its key in OBJECTIVES
    title: str = ""  # what it trains, in messages ("next sentence prediction")
    summary: str = ""  # what it trains on, for a message that suggests it instead
    # The sentence-level task trained beside MLM on BertForPreTraining's sentence head, or None
    # (MLM alone): its label is the next_sentence_label column, its scores are logged as
    # <sentence_task>_loss and <sentence_task>_accuracy (training and held out).
    sentence_task: str | None = None
    packing: str = ""  # how text becomes sequences (objective.packing)
    # Its instances put a second segment (token type 1) after the first, [CLS] A [SEP] B [SEP]:
    # the model then needs two token types (bertkit.training.models.check_model_settings).
    second_segment: bool = False
    # Documents the instances need (each side of the held-out split, each buffer of a
    # stream), why, and an objective that trains on fewer (suggested when a corpus is short).
    documents_needed: int = 1
    documents_reason: str = ""
    fewer_documents: str | None = None
    # With static masking's dupe_factor: each copy of the instances is cut anew (their cuts
    # are random), else the instances are cut once and the copies differ by their masks only.
    cuts_each_copy: bool = False

    def instances(self, tokenized: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, *,
                  max_seq_length: int, short_seq_prob: float, seed: int, copies: int = 1,
                  num_proc: int | None = None) -> datasets.Dataset:
        """The training instances of tokenised documents (a sentence_ids column): input_ids,
        token_type_ids and length, with next_sentence_label for a sentence task. A held-out
        sentence task is scored on these too, built from the held-out documents."""
        raise NotImplementedError

    def buffer_rows(self, documents: Sequence, rng: random.Random, *, max_seq_length: int,
                    short_seq_prob: float, cls_id: int, sep_id: int) -> dict:
        """The columns of one buffer's instances when the corpus is a stream: no random
        access to other documents than the buffer's (streaming_instances)."""
        raise NotImplementedError

    def check_stream(self, buffer_documents: int) -> None:
        """A buffer must hold the documents the instances need."""
        if buffer_documents < self.documents_needed:
            raise BertkitError(
                f"pretraining.streaming_buffer_documents={buffer_documents}: {self.title} needs "
                f"at least {self.documents_needed} documents in a buffer "
                f"({self.documents_reason})")



class MaskedLM(Objective):
    """Masked LM alone (RoBERTa, Liu et al. 2019): sequences packed with whole consecutive
    sentences, across documents (FULL-SENTENCES). No sentence task: the sentence head gets no
    label and no loss."""

    name = "mlm"
    title = "masked LM alone"
    summary = "full sentences packed across documents"
    packing = "full_sentences"

    def instances(self, tokenized: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, *,
                  max_seq_length: int, short_seq_prob: float, seed: int, copies: int = 1,
                  num_proc: int | None = None) -> datasets.Dataset:
        """Cut one way (no randomness): copies differ by their masks only."""
        return packed_sequences_dataset(tokenized, tokenizer, max_seq_length=max_seq_length,
                                        num_proc=num_proc)

    def buffer_rows(self, documents: Sequence, rng: random.Random, *, max_seq_length: int,
                    short_seq_prob: float, cls_id: int, sep_id: int) -> dict:
        return packed_columns(documents, max_seq_length=max_seq_length, cls_id=cls_id,
                              sep_id=sep_id)


class SentencePairObjective(Objective):
    """What the sentence-pair objectives (NSP, SOP) share: Google's packing of a document into
    `[CLS] A [SEP] B [SEP]` pairs (bertkit.pretraining.instances), labelled by the objective's
    sentence task in the next_sentence_label column."""

    packing = "pairs"
    second_segment = True  # segment A, then B (token type 1)
    cuts_each_copy = True  # each duplicate cuts the documents anew, as Google's dupe_factor

    def instances(self, tokenized: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, *,
                  max_seq_length: int, short_seq_prob: float, seed: int, copies: int = 1,
                  num_proc: int | None = None) -> datasets.Dataset:
        return pair_instances_dataset(
            tokenized, tokenizer, max_seq_length=max_seq_length, short_seq_prob=short_seq_prob,
            seed=seed, copies=copies, num_proc=num_proc, sentence_task=self.sentence_task)

    def buffer_rows(self, documents: Sequence, rng: random.Random, *, max_seq_length: int,
                    short_seq_prob: float, cls_id: int, sep_id: int) -> dict:
        """A buffer of fewer documents than needed (the last of a stream, say) gives none."""
        out = {key: [] for key in PAIR_COLUMNS}
        if len(documents) < self.documents_needed:
            return out
        for index in range(len(documents)):
            add_pair_rows(out, documents, index, rng, sentence_task=self.sentence_task,
                          max_seq_length=max_seq_length, short_seq_prob=short_seq_prob,
                          cls_id=cls_id, sep_id=sep_id)
        return out


class NextSentencePrediction(SentencePairObjective):
    """The paper's objective: masked LM + next sentence prediction on sentence pairs, B the
    true continuation half the time and a span of another document otherwise."""

    name = "mlm_nsp"
    title = "next sentence prediction"
    summary = "sentence pairs, half of them with B from another document"
    sentence_task = "nsp"
    documents_needed = 2
    documents_reason = "a NotNext segment comes from another document"
    fewer_documents = "sop"


class SentenceOrderPrediction(SentencePairObjective):
    """Masked LM + sentence order prediction (ALBERT, Lan et al. 2020): A and B are consecutive
    text of one document, swapped half the time. The NSP head of BertForPreTraining serves as
    the two-way SOP head."""

    name = "sop"
    title = "sentence order prediction"
    summary = "sentence order within a document"
    sentence_task = "sop"


# objective.name -> its Objective: every objective, in one place.
OBJECTIVES: dict[str, type[Objective]] = {
    cls.name: cls for cls in (MaskedLM, NextSentencePrediction, SentenceOrderPrediction)}


def register(cls: type[Objective]) -> type[Objective]:
    """Class decorator for an objective defined outside bertkit (a user's module, a test's):
    it joins OBJECTIVES under its module's name (the preset's name)."""
    name = cls.__module__.rsplit(".", 1)[-1]
    if name in OBJECTIVES and OBJECTIVES[name] is not cls:
        raise BertkitError(f"objective {name} is registered twice "
                           f"({OBJECTIVES[name].__qualname__} and {cls.__qualname__})")
    cls.name = name
    OBJECTIVES[name] = cls
    return cls


def registered() -> dict[str, type[Objective]]:
    """name -> class of every objective, sorted by name."""
    return dict(sorted(OBJECTIVES.items()))


def objective_named(name: str) -> Objective:
    """The objective of that name (objective.name)."""
    found = OBJECTIVES.get(name)
    if found is None:
        raise BertkitError(f"objective.name={name!r}: expected one of "
                           f"{', '.join(registered())}")
    return found()


def _shown(value) -> str:
    return "null" if value is None else str(value)


def objective_of(node: DictConfig) -> Objective:
    """The objective the config's `objective` node names, its other keys held to the class's
    (a preset's key overridden to another objective's value names that objective)."""
    objective = objective_named(node.name)
    for key in DESCRIBED_BY:
        own = getattr(objective, key)
        value = node[key]
        if value != own:
            others = [name for name, cls in registered().items() if getattr(cls, key) == value]
            advice = f"objective={others[0]} has it" if others else "no objective has it"
            raise BertkitError(f"objective.{key}={_shown(value)}: objective={objective.name}'s "
                               f"is {_shown(own)} (conf/objective/{objective.name}.yaml); "
                               f"{advice}")
    return objective


class _Values:
    """One key's values over the registered objectives, read when iterated (the schema's
    choices: config_schema resolves "module:NAME" when it checks a value)."""

    def __init__(self, key: str):
        self.key = key

    def __iter__(self):
        values = (getattr(cls, self.key) for cls in registered().values())
        return iter(dict.fromkeys(value for value in values if value is not None))


NAMES, SENTENCE_TASKS, PACKINGS = _Values("name"), _Values("sentence_task"), _Values("packing")


def streaming_instances(tokenized: datasets.IterableDataset, tokenizer: PreTrainedTokenizerBase,
                        *, objective: str, max_seq_length: int, short_seq_prob: float, seed: int,
                        buffer_documents: int) -> datasets.IterableDataset:
    """Training inputs built lazily, buffer_documents tokenised documents at a time.

    The objective (its name) builds each buffer's rows (Objective.buffer_rows): for NSP,
    NotNext segments come from the other documents of the same buffer, so a buffer of a single
    document (the last one of a stream, say) gives no NSP instances; MLM alone packs full
    sentences across the documents of a buffer. Each buffer's generator is seeded by (seed,
    index of its first document in the stream this process reads), so iteration is
    reproducible; with several DataLoader workers each worker counts from 0 over its own
    shards."""
    chosen = objective_named(objective)
    chosen.check_stream(buffer_documents)
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id

    def build(batch: dict, indices: list[int]) -> dict:
        return chosen.buffer_rows(batch["sentence_ids"],
                                  random.Random(f"{seed}-stream-{indices[0]}"),
                                  max_seq_length=max_seq_length, short_seq_prob=short_seq_prob,
                                  cls_id=cls_id, sep_id=sep_id)

    return tokenized.select_columns(["sentence_ids"]).map(
        build, batched=True, batch_size=buffer_documents, with_indices=True,
        remove_columns=["sentence_ids"])
