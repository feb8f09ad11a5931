"""How alike the pooled [CLS] vectors of a task's dev pairs are, per encoder: the measurement
behind the card's STILTs bullets (a pooler that maps every pair to nearly one vector leaves the
next task's new head little to read).

    python recipes/cards/runs/pooled_geometry.py ../shared/data/glue/MRPC <encoder dir> ...

Prints, per encoder (the first is the tokenizer's, e.g. MiniLM), the mean cosine between the
pooled vectors of the first N dev pairs (N = --pairs) and their mean absolute value. With
--similarity (STS-B), also the Spearman correlation between the gold scores of every dev pair
and the cosine of its two sentences' mean-pooled token vectors, with no training: how much of
the sentence-similarity geometry the checkpoint was trained for an encoder still has.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import torch
from scipy import stats
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


def scored_pairs(data_dir: Path) -> tuple[list[str], list[str], list[float]]:
    with open(data_dir / "dev.tsv", encoding="utf-8-sig", newline="") as handle:
        rows = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    header = rows[0]
    a, b, score = (header.index(name) for name in ("sentence1", "sentence2", "score"))
    return [r[a] for r in rows[1:]], [r[b] for r in rows[1:]], [float(r[score]) for r in rows[1:]]


def mean_pooled(model, tokenizer, sentences: list[str], max_length: int) -> torch.Tensor:
    out = []
    for start in range(0, len(sentences), 64):
        batch = tokenizer(sentences[start:start + 64], padding=True, truncation=True,
                          max_length=max_length, return_tensors="pt")
        with torch.no_grad():
            tokens = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(tokens.dtype)
        out.append((tokens * mask).sum(1) / mask.sum(1))
    return torch.cat(out)


def zero_shot_spearman(model, tokenizer, data_dir: Path, max_length: int) -> float:
    first, second, gold = scored_pairs(data_dir)
    u, v = (mean_pooled(model, tokenizer, side, max_length) for side in (first, second))
    cosine = torch.nn.functional.cosine_similarity(u, v, dim=-1)
    return float(stats.spearmanr(cosine.numpy(), gold).statistic)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("encoders", nargs="+")
    parser.add_argument("--pairs", type=int, default=128)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--similarity", action="store_true")
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
        line = (f"{path}: mean pairwise cosine {cosine:.3f}, mean |value| "
                f"{pooled.abs().mean().item():.3f}")
        if args.similarity:
            spearman = zero_shot_spearman(model, tokenizer, args.data_dir, args.max_length)
            line += f", zero-shot Spearman of mean-pooled cosine {100 * spearman:.2f}"
        print(line)


if __name__ == "__main__":
    main()
