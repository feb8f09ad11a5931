"""CoNLL-2003 named-entity recognition: the CoNLL column format (IOB1/IOB2), word-aligned
features, seqeval entity scores, prediction files for conlleval, and the paper's feature-based
tagger on a frozen BERT."""
