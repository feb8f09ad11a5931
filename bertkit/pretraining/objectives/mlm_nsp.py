"""The paper's objective: masked LM + next sentence prediction on sentence pairs, B the true
continuation half the time and a span of another document otherwise
(conf/objective/mlm_nsp.yaml)."""

from __future__ import annotations

from bertkit.pretraining.objective import register
from bertkit.pretraining.pair_objective import SentencePairObjective


@register
class NextSentencePrediction(SentencePairObjective):
    title = "next sentence prediction"
    summary = "sentence pairs, half of them with B from another document"
    sentence_task = "nsp"
    documents_needed = 2
    documents_reason = "a NotNext segment comes from another document"
    fewer_documents = "sop"
