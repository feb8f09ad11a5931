"""Masked LM + sentence order prediction (ALBERT, Lan et al. 2020): A and B are consecutive
text of one document, swapped half the time (conf/objective/sop.yaml). The NSP head of
BertForPreTraining serves as the two-way SOP head."""

from __future__ import annotations

from bertkit.pretraining.objective import register
from bertkit.pretraining.pair_objective import SentencePairObjective


@register
class SentenceOrderPrediction(SentencePairObjective):
    title = "sentence order prediction"
    summary = "sentence order within a document"
    sentence_task = "sop"
