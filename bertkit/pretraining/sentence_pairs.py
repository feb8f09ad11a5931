"""Sentence-pair training instances for MLM + next sentence prediction, following Google's
create_pretraining_data.py (create_instances_from_document), or sentence order prediction
(ALBERT, Lan et al. 2020).

Sentences of a document are packed up to a target length (max_seq_length - 3, or with
probability short_seq_prob a random shorter one); the packed chunk is split at a random
sentence boundary into A and B; half the time B is replaced by a span of another document and
the unused sentences go back into the stream; an over-long pair loses tokens from the front or
the back of its longer segment at random.

Sentence order prediction packs and splits the same way but B always is the text that follows
A; half the time the two are swapped. ALBERT's code makes a one-sentence chunk a NotNext pair
even under SOP; here it is cut at a random token instead, so every pair stays in one document.

Documents are lists of sentences; a sentence is a list of token ids.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from bertkit.errors import BertkitError

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
