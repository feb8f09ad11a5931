"""SWAG files in the release's CSV layout (a leading unnamed index column, then video-id,
fold-ind, startphrase, sent1, sent2, gold-source, ending0..ending3, label), generated, with a
whole-word vocabulary that covers every word written."""

from __future__ import annotations

import csv
import random
from pathlib import Path

HEADER = ["", "video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source",
          "ending0", "ending1", "ending2", "ending3", "label"]
SUBJECTS = ["the man", "a woman", "the boy", "a girl", "the dog", "people"]
VERBS = ["walks", "runs", "sits", "jumps", "swims", "smiles", "plays", "reads"]
PLACES = ["the park", "the pool", "the street", "a field", "the house", "a boat"]
WORDS = sorted({w for phrase in SUBJECTS + VERBS + PLACES for w in phrase.split()}
               | {"to", "in", "on", "then", "and", "slowly", "quickly", "again", "he", "she",
                  "they", "with", "ball", "book"})


def write_vocab(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ","] + WORDS
    (directory / "vocab.txt").write_text("\n".join(tokens) + "\n")
    return directory


def make_row(rng: random.Random, i: int) -> dict:
    """A learnable example: the true ending repeats the place of sent1; the others do not."""
    subject, place = rng.choice(SUBJECTS), rng.choice(PLACES)
    sent1 = f"{subject} {rng.choice(VERBS)} in {place}."
    sent2 = rng.choice(["then he", "she", "they", "then they"])
    label = rng.randrange(4)
    others = [p for p in PLACES if p != place]
    endings = [f"{rng.choice(VERBS)} to {place if k == label else rng.choice(others)} "
               f"{rng.choice(['slowly', 'quickly', 'again', 'with ball, and book'])}."
               for k in range(4)]
    return {"": str(i), "video-id": f"anetv_{i:05d}", "fold-ind": str(1000 + i),
            "startphrase": f"{sent1} {sent2}", "sent1": sent1, "sent2": sent2,
            "gold-source": "gold", **{f"ending{k}": e for k, e in enumerate(endings)},
            "label": str(label)}


def make_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [make_row(rng, i) for i in range(n)]


def write_swag_csv(path: Path, rows: list[dict], header: list[str] | None = None) -> Path:
    """csv.writer's quoting, as pandas' to_csv (the release's writer) does: fields with a
    comma or quote are quoted."""
    header = header or HEADER
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(header)
        for row in rows:
            writer.writerow([row.get(name, "") for name in header])
    return path
