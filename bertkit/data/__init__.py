"""Data machinery every family shares: which files a task reads (split_files, sources), the Hub
loader with its offline message, text decoding, content and tokenizer fingerprints, the one
cache of tokenised data, and atomic result files.

Imports nothing of bertkit but `errors`; families, pretraining, training and reporting import it.
"""
