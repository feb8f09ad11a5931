"""Sentence-pair training instances for MLM + next sentence prediction, following Google's
create_pretraining_data.py (create_instances_from_document).

Sentences of a document are packed up to a target length (max_seq_length - 3, or with
probability short_seq_prob a random shorter one); the packed chunk is split at a random
sentence boundary into A and B; half the time B is replaced by a span of another document and
the unused sentences go back into the stream; an over-long pair loses tokens from the front or
the back of its longer segment at random.

Documents are lists of sentences; a sentence is a list of token ids.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from bertkit.errors import BertkitError

Document = Sequence[Sequence[int]]
IS_NEXT, NOT_NEXT = 0, 1  # BertForPreTraining's next_sentence_label convention


@dataclass
class PairInstance:
    tokens_a: list[int]
    tokens_b: list[int]
    is_random_next: bool


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


def pair_instances_from_document(documents: Sequence[Document], index: int, *,
                                 max_seq_length: int, short_seq_prob: float,
                                 rng: random.Random) -> list[PairInstance]:
    if len(documents) < 2:
        raise BertkitError("next sentence prediction needs at least 2 documents in the corpus "
                           "(blank lines separate documents)")
    document = documents[index]
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
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            tokens_a = [token for sentence in chunk[:a_end] for token in sentence]
            tokens_b: list[int] = []
            is_random_next = len(chunk) == 1 or rng.random() < 0.5
            if is_random_next:
                other = documents[_random_other_document(documents, index, rng)]
                for sentence in other[rng.randrange(len(other)):]:
                    tokens_b.extend(sentence)
                    if len(tokens_b) >= target - len(tokens_a):
                        break
                i -= len(chunk) - a_end  # the unused sentences go back into the stream
            else:
                tokens_b = [token for sentence in chunk[a_end:] for token in sentence]
            truncate_pair(tokens_a, tokens_b, max_tokens, rng)
            if tokens_a and tokens_b:
                instances.append(PairInstance(tokens_a, tokens_b, is_random_next))
            chunk, chunk_length = [], 0
        i += 1
    return instances


def model_inputs(instance: PairInstance, cls_id: int, sep_id: int) -> dict:
    """[CLS] A [SEP] B [SEP] with segment ids 0 then 1, and the NSP label."""
    a, b = instance.tokens_a, instance.tokens_b
    return {
        "input_ids": [cls_id, *a, sep_id, *b, sep_id],
        "token_type_ids": [0] * (len(a) + 2) + [1] * (len(b) + 1),
        "next_sentence_label": NOT_NEXT if instance.is_random_next else IS_NEXT,
    }
