"""How alike the pooled [CLS] vectors of a task's dev pairs are, per encoder: the measurement
behind the card's STILTs bullets (a pooler that maps every pair to nearly one vector leaves the
next task's new head little to read).

    python cards/finetuning/pooled_geometry.py ../shared/data/glue/MRPC <encoder dir> ...

Prints, per encoder (the first is the tokenizer's, e.g. MiniLM), the mean cosine between the
pooled vectors of the first N dev pairs (N = --pairs) and their mean absolute value. With
--similarity (STS-B), also the Spearman correlation between the gold scores of every dev pair
and the cosine of its two sentences' mean-pooled token vectors, with no training: how much of
the sentence-similarity geometry the checkpoint was trained for an encoder still has.

A side script, not bertkit-report: it measures encoders (their checkpoints, which the run
records do not keep), not runs' results, so the report has nothing to draw it from.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import torch
from scipy import stats
from transformers import AutoModel, AutoTokenizer

from bertkit.finetuning.head_inputs import use_mean_pooling

# GLUE's column names of the two sentences, per task file (MRPC keeps Microsoft's).
SENTENCES = [("sentence1", "sentence2"), ("#1 String", "#2 String")]


def dev_rows(data_dir: Path) -> tuple[list[str], list[list[str]]]:
    with open(data_dir / "dev.tsv", encoding="utf-8-sig", newline="") as handle:
        rows = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    return rows[0], rows[1:]


def sentence_pairs(header: list[str], rows: list[list[str]]) -> tuple[list[str], list[str]]:
    names = next((pair for pair in SENTENCES if set(pair) <= set(header)), None)
    if names is None:
        raise SystemExit(f"dev.tsv: no sentence-pair columns {SENTENCES} in {header}")
    first, second = (header.index(name) for name in names)
    return [row[first] for row in rows], [row[second] for row in rows]


def zero_shot_spearman(model, tokenizer, header, rows, max_length: int) -> float:
    """Spearman of gold scores against the cosine of the two sentences' pooled outputs, after
    bertkit's own mean pooling (finetuning.pooling=mean) has replaced the pooler."""
    gold = [float(row[header.index("score")]) for row in rows]
    sides = []
    for side in sentence_pairs(header, rows):
        pooled = []
        for start in range(0, len(side), 64):
            batch = tokenizer(side[start:start + 64], padding=True, truncation=True,
                              max_length=max_length, return_tensors="pt")
            with torch.no_grad():
                pooled.append(model(**batch).pooler_output)
        sides.append(torch.cat(pooled))
    cosine = torch.nn.functional.cosine_similarity(*sides, dim=-1)
    return float(stats.spearmanr(cosine.numpy(), gold).statistic)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("encoders", nargs="+")
    parser.add_argument("--pairs", type=int, default=128)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--similarity", action="store_true")
    args = parser.parse_args()
    header, rows = dev_rows(args.data_dir)
    first, second = sentence_pairs(header, rows[:args.pairs])
    tokenizer = AutoTokenizer.from_pretrained(args.encoders[0])
    batch = tokenizer(first, second, padding=True, truncation=True,
                      max_length=args.max_length, return_tensors="pt")
    for path in args.encoders:
        model = AutoModel.from_pretrained(path).eval()
        with torch.no_grad():
            pooled = model(**batch).pooler_output
        unit = torch.nn.functional.normalize(pooled, dim=-1)
        cosine = (unit @ unit.T)[~torch.eye(len(unit), dtype=torch.bool)].mean().item()
        line = (f"{path}: mean pairwise cosine {cosine:.3f}, mean |value| "
                f"{pooled.abs().mean().item():.3f}")
        if args.similarity:
            use_mean_pooling(model)
            spearman = zero_shot_spearman(model, tokenizer, header, rows, args.max_length)
            line += f", zero-shot Spearman of mean-pooled cosine {100 * spearman:.2f}"
        print(line)


if __name__ == "__main__":
    main()
