"""SQuAD v1.1 / v2.0 extractive question answering: the release JSON, Google's windows,
answer decoding, and the official exact/F1 scores (v2.0 with null odds and the best
threshold), computed in-process."""
