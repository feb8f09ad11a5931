"""Data machinery every family shares: which files a task reads (split_files, sources), the Hub
loader with its offline message, text decoding, content and tokenizer fingerprints, the one
cache of tokenised data, atomic result files, and a sweep job's configuration (job_overrides).

Imports nothing of bertkit but `errors`; families, pretraining, training and reporting import it.
"""
