"""How alike the pooled [CLS] vectors of a task's dev pairs are, per encoder: the measurement
behind the card's STILTs bullets (a pooler that maps every pair to nearly one vector leaves the
next task's new head little to read).

    python recipes/cards/runs/pooled_geometry.py ../shared/data/glue/MRPC <encoder dir> ...

Prints, per encoder (the first is the tokenizer's, e.g. MiniLM), the mean cosine between the
pooled vectors of the first N dev pairs (N = --pairs) and their mean absolute value.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import torch
from transformers import AutoModel, AutoTokenizer

# GLUE's column names of the two sentences, per task file (MRPC keeps Microsoft's).
SENTENCES = [("sentence1", "sentence2"), ("#1 String", "#2 String")]


def dev_pairs(data_dir: Path, count: int) -> list[tuple[str, str]]:
    with open(data_dir / "dev.tsv", encoding="utf-8-sig", newline="") as handle:
        rows = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    header = rows[0]
    names = next((pair for pair in SENTENCES if set(pair) <= set(header)), None)
    if names is None:
        raise SystemExit(f"{data_dir / 'dev.tsv'}: no sentence-pair columns {SENTENCES} "
                         f"in {header}")
    first, second = (header.index(name) for name in names)
    return [(row[first], row[second]) for row in rows[1:count + 1]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("encoders", nargs="+")
    parser.add_argument("--pairs", type=int, default=128)
    parser.add_argument("--max-length", type=int, default=128)
    args = parser.parse_args()
    pairs = dev_pairs(args.data_dir, args.pairs)
    tokenizer = AutoTokenizer.from_pretrained(args.encoders[0])
    batch = tokenizer([a for a, _ in pairs], [b for _, b in pairs], padding=True,
                      truncation=True, max_length=args.max_length, return_tensors="pt")
    for path in args.encoders:
        model = AutoModel.from_pretrained(path).eval()
        with torch.no_grad():
            pooled = model(**batch).pooler_output
        unit = torch.nn.functional.normalize(pooled, dim=-1)
        cosine = (unit @ unit.T)[~torch.eye(len(unit), dtype=torch.bool)].mean().item()
        print(f"{path}: mean pairwise cosine {cosine:.3f}, mean |value| "
              f"{pooled.abs().mean().item():.3f}")


if __name__ == "__main__":
    main()
