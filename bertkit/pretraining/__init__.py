"""Pretraining BertForPreTraining from raw documents: corpora, WordPiece training, NSP/SOP
sentence pairs or packed full sentences, static or dynamic masking, the two sequence-length
phases, the masked-only MLM head, and the GLUE finetunes run right after on the checkpoint.

Imports `bertkit.data` and `bertkit.training`; its downstream finetunes reach a task family
through the table of `bertkit.tasks`, never by importing it.
"""
