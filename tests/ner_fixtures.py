"""Hand-made NER data for the tests: a cased WordPiece vocabulary with ## pieces, and CoNLL-2003
files (`token POS chunk NER`, -DOCSTART- lines, blank lines between sentences) generated with
entities of every type, multi-piece words and multi-word entities."""

from __future__ import annotations

import random
from pathlib import Path

from transformers import BertTokenizerFast

LABELS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
ID = {label: i for i, label in enumerate(LABELS)}

# Whole words, and the ## pieces that make longer words out of them:
# "Johnson" = John ##son, "Yorker" = York ##er, "Parisian" = Paris ##ian, "AcmeCorp" = Acme
# ##Corp, "walking" = walk ##ing.
PIECES = ["##son", "##er", "##ian", "##Corp", "##ing"]
FILLER = ["the", "a", "said", "went", "to", "in", "on", "visited", "walk", "talks", "with",
          "and", "of", "for", "by", "after", "match", "team", "won", "lost", "he", "she"]
ENTITIES = {
    "PER": [["John"], ["Johnson"], ["Mary", "Smith"], ["John", "Smithson"]],
    "ORG": [["Acme"], ["AcmeCorp"], ["United", "Nations"], ["Reuters"]],
    "LOC": [["Paris"], ["New", "York"], ["Berlin"], ["York"]],
    "MISC": [["Parisian"], ["Yorker"], ["German"], ["World", "Cup"]],
}
WORDS = sorted({*FILLER, "Smith", ".", ",",
                *(w for names in ENTITIES.values() for name in names for w in name
                  if w not in ("Johnson", "AcmeCorp", "Smithson", "Parisian", "Yorker"))})


def write_vocab(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *PIECES, *WORDS]
    (directory / "vocab.txt").write_text("\n".join(tokens) + "\n")
    return directory


def make_tokenizer(directory: Path) -> BertTokenizerFast:
    return BertTokenizerFast.from_pretrained(str(write_vocab(directory)), do_lower_case=False)


def make_sentences(n: int, seed: int = 0) -> list[list[tuple[str, str]]]:
    """n sentences of (word, IOB2 tag): 4-14 words, about a third of them in entities."""
    rng = random.Random(seed)
    sentences = []
    for _ in range(n):
        words: list[tuple[str, str]] = []
        while len(words) < rng.randint(4, 14):
            if rng.random() < 0.35:
                kind = rng.choice(sorted(ENTITIES))
                name = rng.choice(ENTITIES[kind])
                words += [(w, f"{'B' if i == 0 else 'I'}-{kind}") for i, w in enumerate(name)]
            else:
                words.append((rng.choice(FILLER), "O"))
        words.append((".", "O"))
        sentences.append(words)
    return sentences


def to_iob1(tags: list[str]) -> list[str]:
    """IOB2 -> IOB1 (the original CoNLL-2003 release): an entity starts with I-X, and with B-X
    only right after an entity of the same type X."""
    out = []
    for i, tag in enumerate(tags):
        previous = tags[i - 1] if i else "O"
        if tag.startswith("B-") and previous[2:] != tag[2:]:
            tag = "I-" + tag[2:]
        out.append(tag)
    return out


def conll_text(sentences: list[list[tuple[str, str]]], per_document: int = 4) -> str:
    """The CoNLL-2003 layout: a -DOCSTART- line (and a blank line) before every
    `per_document` sentences, `word POS chunk tag` lines, a blank line after each sentence."""
    lines = []
    for i, sentence in enumerate(sentences):
        if i % per_document == 0:
            lines += ["-DOCSTART- -X- -X- O", ""]
        lines += [f"{word} NN I-NP {tag}" for word, tag in sentence]
        lines.append("")
    return "\n".join(lines) + "\n"


def write_conll(path: Path, n: int, seed: int = 0, per_document: int = 4) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(conll_text(make_sentences(n, seed), per_document))
    return path


def read_columns(path: Path) -> list[list[list[str]]]:
    """An independent reader of a prediction file: per sentence, the fields of each line."""
    sentences, current = [], []
    for line in Path(path).read_text().split("\n"):
        if line.strip():
            current.append(line.split(" "))
        elif current:
            sentences.append(current)
            current = []
    if current:
        sentences.append(current)
    return sentences
