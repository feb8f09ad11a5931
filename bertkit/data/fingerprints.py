"""Fingerprints that key the on-disk caches of tokenised data: by content (file bytes, reading
rules) and by tokenizer, never by path, so every run and sweep job that reads the same data
with the same tokenizer reuses one cache and no other run does."""

from __future__ import annotations

import hashlib
import json

from transformers import PreTrainedTokenizerBase


def content_fingerprint(*parts: str | bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """The vocabulary and rules, without the truncation and padding settings that every call
    leaves in the backend tokenizer (with them, a second encoding in one process missed)."""
    if not tokenizer.is_fast:
        return hashlib.sha256(repr(tokenizer).encode()).hexdigest()[:16]
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    state.pop("truncation", None)
    state.pop("padding", None)
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()[:16]
