"""The pretraining objectives in one plain table, OBJECTIVES: masked LM alone (mlm), with next
sentence prediction (mlm_nsp, the paper's) or with sentence order prediction (sop). Each is an
Objective, picked by a preset conf/objective/<name>.yaml (`objective=<name>`); the rest of
pretraining asks the objective what it does (its instances, its sentence task, the documents
it needs) instead of comparing its name. Adding an objective: a class here, its line in
OBJECTIVES and a preset (or, outside bertkit, a class decorated with @register). The
instances they train on (the last section) are built here too: an objective is the data it
labels.

The preset's keys stay what users override and runs record (objective.name,
objective.sentence_task, objective.packing); they are the class's, and a value the class does
not have is refused naming the key.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import datasets
import pyarrow as pa
from omegaconf import DictConfig
from transformers import PreTrainedTokenizerBase

from bertkit.errors import BertkitError

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
    `[CLS] A [SEP] B [SEP]` pairs (the instances, below), labelled by the objective's
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


# ================================================================================================
# Pretraining data as datasets: documents -> token ids per sentence -> NSP or SOP pair
# instances, or full-sentence packed sequences for MLM alone.
#
# Both steps run through datasets.map (batched, several processes, cached by fingerprint).
# Each document's pair instances come from a generator seeded by (seed, copy, document index),
# so they do not depend on the process count or batch size.
#
# A corpus larger than memory is read as a datasets.IterableDataset (streaming=True); there is
# no random access to other documents, so a stream's instances (objective.streaming_instances)
# draw NotNext segments from the other documents of a buffer of consecutive documents.

PAIR_COLUMNS = ("input_ids", "token_type_ids", "next_sentence_label", "length")
PACKED_COLUMNS = ("input_ids", "token_type_ids", "length")


def documents_dataset(documents: Iterable[list[str]]) -> datasets.Dataset:
    """In memory; a corpus larger than memory goes through objective.streaming_instances
    instead."""
    return datasets.Dataset.from_dict({"sentences": list(documents)})


def tokenize_documents(documents: datasets.Dataset | datasets.IterableDataset,
                       tokenizer: PreTrainedTokenizerBase,
                       num_proc: int | None = None) -> datasets.Dataset | datasets.IterableDataset:
    """Column sentence_ids: one list of WordPiece ids per sentence; empty sentences dropped.

    An IterableDataset stays lazy: it is tokenised as it is read, in the reading process
    (num_proc does not apply)."""

    def encode(batch: dict) -> dict:
        flat = [sentence for document in batch["sentences"] for sentence in document]
        ids = tokenizer(flat, add_special_tokens=False)["input_ids"] if flat else []
        out, start = [], 0
        for document in batch["sentences"]:
            out.append([s for s in ids[start:start + len(document)] if s])
            start += len(document)
        return {"sentence_ids": out}

    if isinstance(documents, datasets.IterableDataset):
        # Its features may be unknown (column_names None), so keep the one column we read.
        tokenized = documents.select_columns(["sentences"]).map(
            encode, batched=True, remove_columns=["sentences"])
        return tokenized.filter(_has_sentences)
    tokenized = documents.map(encode, batched=True, num_proc=num_proc,
                              remove_columns=documents.column_names, desc="Tokenizing documents")
    return tokenized.filter(_has_sentences, num_proc=num_proc)


def _has_sentences(row: dict) -> bool:
    return len(row["sentence_ids"]) > 0


class _ArrowDocument(Sequence):
    """One tokenised document left in Arrow: a NotNext segment reads the few sentences it
    takes, not the whole document (a book can hold 10^5 sentences)."""

    def __init__(self, sentences: pa.ListArray):
        self.sentences = sentences

    def __len__(self) -> int:
        return len(self.sentences)

    def __getitem__(self, position):
        if isinstance(position, slice):
            return self.sentences.to_pylist()[position]
        return self.sentences[position].as_py()

    def __iter__(self):
        return iter(self.sentences.to_pylist())


class _DocumentView(Sequence):
    """Random access to tokenised documents without loading the corpus into memory."""

    def __init__(self, tokenized: datasets.Dataset):
        self.tokenized = tokenized.select_columns(["sentence_ids"]).with_format("arrow")

    def __len__(self) -> int:
        return len(self.tokenized)

    def __getitem__(self, index) -> _ArrowDocument:
        return _ArrowDocument(self.tokenized[index].column("sentence_ids")[0].values)


def add_pair_rows(out: dict, documents, index: int, rng: random.Random, *, sentence_task: str,
                   max_seq_length: int, short_seq_prob: float, cls_id: int, sep_id: int) -> None:
    for instance in pair_instances_from_document(
            documents, index, max_seq_length=max_seq_length, short_seq_prob=short_seq_prob,
            rng=rng, sentence_task=sentence_task):
        row = model_inputs(instance, cls_id, sep_id)
        for key, value in row.items():
            out[key].append(value)
        out["length"].append(len(row["input_ids"]))


def packed_columns(documents, *, max_seq_length: int, cls_id: int, sep_id: int) -> dict:
    rows = pack_full_sentences(documents, max_seq_length=max_seq_length, cls_id=cls_id,
                               sep_id=sep_id)
    return {key: [row[key] for row in rows] for key in PACKED_COLUMNS}


def pair_instances_dataset(tokenized: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, *,
                           max_seq_length: int, short_seq_prob: float, seed: int,
                           copies: int = 1, num_proc: int | None = None,
                           sentence_task: str = "nsp") -> datasets.Dataset:
    """input_ids, token_type_ids, next_sentence_label and length, `copies` times over.

    sentence_task "sop" makes sentence order pairs; their label keeps the NSP column name."""
    check_sentence_task(sentence_task)
    view = _DocumentView(tokenized)
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id

    def build(batch: dict, indices: list[int], copy: int) -> dict:
        out = {key: [] for key in PAIR_COLUMNS}
        for index in indices:
            add_pair_rows(out, view, index, random.Random(f"{seed}-{copy}-{index}"),
                           sentence_task=sentence_task, max_seq_length=max_seq_length,
                           short_seq_prob=short_seq_prob, cls_id=cls_id, sep_id=sep_id)
        return out

    parts = [tokenized.map(build, batched=True, with_indices=True, fn_kwargs={"copy": copy},
                           remove_columns=tokenized.column_names, num_proc=num_proc,
                           desc=f"{sentence_task.upper()} instances, copy {copy + 1}")
             for copy in range(copies)]
    return datasets.concatenate_datasets(parts)


def packed_sequences_dataset(tokenized: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, *,
                             max_seq_length: int, num_proc: int | None = None,
                             batch_size: int = 1000) -> datasets.Dataset:
    """input_ids, token_type_ids and length of full-sentence packed sequences for MLM alone.

    Packing crosses documents only within one map batch of batch_size documents, so the last
    sequence of each batch may be short. With num_proc the dataset is first cut into num_proc
    contiguous shards and batches restart at each shard, so the output depends on num_proc
    only at the shard boundaries."""
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id

    def build(batch: dict) -> dict:
        return packed_columns(batch["sentence_ids"], max_seq_length=max_seq_length,
                               cls_id=cls_id, sep_id=sep_id)

    return tokenized.map(build, batched=True, batch_size=batch_size, num_proc=num_proc,
                         remove_columns=tokenized.column_names, desc="Packing full sentences")



# Sentence-pair training instances for MLM + next sentence prediction, following Google's
# create_pretraining_data.py (create_instances_from_document), or sentence order prediction
# (ALBERT, Lan et al. 2020).
#
# Sentences of a document are packed up to a target length (max_seq_length - 3, or with
# probability short_seq_prob a random shorter one); the packed chunk is split at a random
# sentence boundary into A and B; half the time B is replaced by a span of another document and
# the unused sentences go back into the stream; an over-long pair loses tokens from the front or
# the back of its longer segment at random.
#
# Sentence order prediction packs and splits the same way but B always is the text that follows
# A; half the time the two are swapped. ALBERT's code makes a one-sentence chunk a NotNext pair
# even under SOP; here it is cut at a random token instead, so every pair stays in one document.
#
# Documents are lists of sentences; a sentence is a list of token ids.


Document = Sequence[Sequence[int]]
IS_NEXT, NOT_NEXT = 0, 1  # BertForPreTraining's next_sentence_label convention
IN_ORDER, SWAPPED = 0, 1  # AlbertForPreTraining's sentence_order_label convention
SENTENCE_TASKS = ("nsp", "sop")


@dataclass
class PairInstance:
    tokens_a: list[int]
    tokens_b: list[int]
    is_random_next: bool  # the negative class: NotNext for NSP, swapped segments for SOP


def check_sentence_task(sentence_task: str) -> None:
    if sentence_task not in SENTENCE_TASKS:
        raise BertkitError(f"objective.sentence_task must be one of {', '.join(SENTENCE_TASKS)}, "
                           f"not {sentence_task!r}")


def truncate_pair(tokens_a: list[int], tokens_b: list[int], max_tokens: int,
                  rng: random.Random) -> None:
    """Trim the longer segment, one token at a time, from its front or back at random."""
    while len(tokens_a) + len(tokens_b) > max_tokens:
        longer = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def _random_other_document(documents: Sequence[Document], index: int,
                           rng: random.Random) -> int:
    # Google's code tries 10 times and may fall back to the same document; drawing from the
    # others directly guarantees that NotNext text comes from another document.
    other = rng.randrange(len(documents) - 1)
    return other if other < index else other + 1


def _nsp_pair(chunk: list[Sequence[int]], documents: Sequence[Document], index: int,
              target: int, rng: random.Random) -> tuple[PairInstance, int]:
    """Google's split of a chunk, and how many of its sentences go back into the stream."""
    a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
    tokens_a = [token for sentence in chunk[:a_end] for token in sentence]
    tokens_b: list[int] = []
    is_random_next = len(chunk) == 1 or rng.random() < 0.5
    if not is_random_next:
        tokens_b = [token for sentence in chunk[a_end:] for token in sentence]
        return PairInstance(tokens_a, tokens_b, False), 0
    other = documents[_random_other_document(documents, index, rng)]
    # Sentence by sentence: a lazy document (e.g. a whole book in Arrow) is read only as far
    # as B needs, not to its end.
    for position in range(rng.randrange(len(other)), len(other)):
        tokens_b.extend(other[position])
        if len(tokens_b) >= target - len(tokens_a):
            break
    return PairInstance(tokens_a, tokens_b, True), len(chunk) - a_end


def _sop_pair(chunk: list[Sequence[int]], rng: random.Random) -> PairInstance | None:
    """A and the text after it, swapped half the time; a lone sentence is cut at a token."""
    if len(chunk) >= 2:
        a_end = rng.randint(1, len(chunk) - 1)
        tokens_a = [token for sentence in chunk[:a_end] for token in sentence]
        tokens_b = [token for sentence in chunk[a_end:] for token in sentence]
    elif len(chunk[0]) >= 2:
        cut = rng.randint(1, len(chunk[0]) - 1)
        tokens_a, tokens_b = list(chunk[0][:cut]), list(chunk[0][cut:])
    else:
        return None  # one token cannot make two segments
    swapped = rng.random() < 0.5
    if swapped:
        tokens_a, tokens_b = tokens_b, tokens_a
    return PairInstance(tokens_a, tokens_b, swapped)


def pair_instances_from_document(documents: Sequence[Document], index: int, *,
                                 max_seq_length: int, short_seq_prob: float,
                                 rng: random.Random,
                                 sentence_task: str = "nsp") -> list[PairInstance]:
    """Pairs from documents[index]; the other documents only supply NSP's NotNext segments."""
    check_sentence_task(sentence_task)
    if sentence_task == "nsp" and len(documents) < 2:
        raise BertkitError("next sentence prediction needs at least 2 documents in the corpus "
                           "(blank lines separate documents)")
    document = list(documents[index])
    max_tokens = max_seq_length - 3  # [CLS] A [SEP] B [SEP]
    target = max_tokens
    if rng.random() < short_seq_prob:
        target = rng.randint(2, max_tokens)

    instances: list[PairInstance] = []
    chunk: list[Sequence[int]] = []
    chunk_length = 0
    i = 0
    while i < len(document):
        chunk.append(document[i])
        chunk_length += len(document[i])
        if i == len(document) - 1 or chunk_length >= target:
            if sentence_task == "sop":
                instance = _sop_pair(chunk, rng)
            else:
                instance, unused = _nsp_pair(chunk, documents, index, target, rng)
                i -= unused  # the unused sentences go back into the stream
            if instance is not None:
                truncate_pair(instance.tokens_a, instance.tokens_b, max_tokens, rng)
                if instance.tokens_a and instance.tokens_b:
                    instances.append(instance)
            chunk, chunk_length = [], 0
        i += 1
    return instances


def model_inputs(instance: PairInstance, cls_id: int, sep_id: int) -> dict:
    """[CLS] A [SEP] B [SEP] with segment ids 0 then 1, and the NSP or SOP label.

    The key is next_sentence_label for either task: BertForPreTraining's NSP head serves as
    the SOP head, and 1 means NotNext or swapped."""
    a, b = instance.tokens_a, instance.tokens_b
    return {
        "input_ids": [cls_id, *a, sep_id, *b, sep_id],
        "token_type_ids": [0] * (len(a) + 2) + [1] * (len(b) + 1),
        "next_sentence_label": NOT_NEXT if instance.is_random_next else IS_NEXT,
    }


# MLM-only inputs packed with whole sentences: RoBERTa's FULL-SENTENCES (Liu et al. 2019,
# section 4.2).
#
# Each sequence is [CLS] tokens [SEP] with consecutive whole sentences up to max_seq_length - 2
# tokens. Packing goes on across documents, with an extra [SEP] between two documents that
# share a sequence (counted in the length), so no sequence is left short because its document
# ended. A sentence longer than the budget is cut into budget-sized pieces, the remainder last;
# no token is dropped. A sequence is closed only when the next sentence (or piece, with its
# document separator) does not fit, so all but the last are nearly full.
#
# Documents are lists of sentences; a sentence is a list of token ids.


def _pieces(sentence: Sequence[int], budget: int) -> Iterator[list[int]]:
    """The sentence whole when it fits, else budget-sized pieces in order."""
    for start in range(0, len(sentence), budget):
        yield list(sentence[start:start + budget])


def _sequence(tokens: list[int], cls_id: int, sep_id: int) -> dict:
    input_ids = [cls_id, *tokens, sep_id]
    return {"input_ids": input_ids, "token_type_ids": [0] * len(input_ids),
            "length": len(input_ids)}


def pack_full_sentences(documents: Sequence[Sequence[Sequence[int]]], *, max_seq_length: int,
                        cls_id: int, sep_id: int) -> list[dict]:
    """input_ids, token_type_ids (all 0) and length per packed sequence, in corpus order."""
    budget = max_seq_length - 2  # [CLS] ... [SEP]
    if budget < 1:
        raise BertkitError(f"max_seq_length must be at least 3 to pack sentences, "
                           f"not {max_seq_length}")
    sequences: list[dict] = []
    current: list[int] = []
    for document in documents:
        new_document = bool(current)  # a separator is due before this document's first token
        for sentence in document:
            for piece in _pieces(sentence, budget):
                if len(current) + new_document + len(piece) > budget:
                    sequences.append(_sequence(current, cls_id, sep_id))
                    current, new_document = [], False
                if new_document:
                    current.append(sep_id)
                    new_document = False
                current.extend(piece)
    if current:
        sequences.append(_sequence(current, cls_id, sep_id))
    return sequences
