"""The embedded demo set: generated, so that `make demo` needs neither the Hub nor ../shared.

A sentence is filler words with a few cue words mixed in; its label is 1 when it holds more
positive than negative cues. A small BERT learns this in a few hundred steps, so the demo
shows a real learning curve. The vocabulary is whole words plus BERT's special tokens.
"""

from __future__ import annotations

import random
from pathlib import Path

from bertkit.data.atomic_files import write_text_atomic

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
POSITIVE = ["good", "great", "fine", "bright", "happy", "superb", "lovely", "warm"]
NEGATIVE = ["bad", "awful", "poor", "dull", "sad", "grim", "ugly", "cold"]
FILLER = [
    "the", "a", "film", "story", "actor", "plot", "scene", "music", "was", "is", "and", "but",
    "very", "quite", "with", "of", "in", "to", "it", "this", "that", "ending", "cast", "script",
    "director", "camera", "light", "night", "day", "city", "house", "road", "long", "short",
    "old", "new", "some", "many", "its", "their", "one", "two", "first", "last", "again",
]


def _sentence(rng: random.Random, min_words: int, max_words: int) -> tuple[str, int]:
    while True:
        words = rng.choices(FILLER, k=rng.randint(min_words, max_words))
        pos, neg = rng.randint(0, 4), rng.randint(0, 4)
        if pos != neg:
            break
    for cue in rng.choices(POSITIVE, k=pos) + rng.choices(NEGATIVE, k=neg):
        words.insert(rng.randrange(len(words) + 1), cue)
    return " ".join(words), int(pos > neg)


def write_demo_data(data_dir: str | Path, *, num_train: int, num_validation: int, num_test: int,
                    min_words: int, max_words: int, seed: int) -> Path:
    """Write train.tsv / dev.tsv / test.tsv (SST-2 layout) and vocab.txt; idempotent."""
    data_dir = Path(data_dir)
    rng = random.Random(seed)
    splits = {"train.tsv": num_train, "dev.tsv": num_validation, "test.tsv": num_test}
    for name, count in splits.items():
        examples = [_sentence(rng, min_words, max_words) for _ in range(count)]
        if name == "test.tsv":
            lines = ["index\tsentence"] + [f"{i}\t{text}" for i, (text, _) in enumerate(examples)]
        else:
            lines = ["sentence\tlabel"] + [f"{text}\t{label}" for text, label in examples]
        write_text_atomic(data_dir / name, "\n".join(lines) + "\n")
    vocab = SPECIAL_TOKENS + sorted(set(POSITIVE + NEGATIVE + FILLER))
    write_text_atomic(data_dir / "vocab.txt", "\n".join(vocab) + "\n")
    return data_dir


def ensure_demo_data(data_dir: str | Path, synthetic: dict) -> Path:
    data_dir = Path(data_dir)
    needed = ["train.tsv", "dev.tsv", "test.tsv", "vocab.txt"]
    if not all((data_dir / name).is_file() for name in needed):
        write_demo_data(data_dir, **synthetic)
    return data_dir
