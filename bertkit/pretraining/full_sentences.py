"""MLM-only inputs packed with whole sentences: RoBERTa's FULL-SENTENCES (Liu et al. 2019,
section 4.2).

Each sequence is [CLS] tokens [SEP] with consecutive whole sentences up to max_seq_length - 2
tokens. Packing goes on across documents, with an extra [SEP] between two documents that
share a sequence (counted in the length), so no sequence is left short because its document
ended. A sentence longer than the budget is cut into budget-sized pieces, the remainder last;
no token is dropped. A sequence is closed only when the next sentence (or piece, with its
document separator) does not fit, so all but the last are nearly full.

Documents are lists of sentences; a sentence is a list of token ids.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from bertkit.errors import BertkitError


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
