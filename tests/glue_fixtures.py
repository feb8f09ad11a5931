"""GLUE task files in each task's original layout, with the real files' quirks: MRPC's BOM,
CoLA's missing header on train/dev, MNLI's two dev and two test files and extra columns,
STS-B's float scores, and fields that start with a bare double quote (QUOTE_NONE)."""

from __future__ import annotations

import random
from pathlib import Path

WORDS = ["the", "cat", "dog", "sat", "on", "mat", "a", "man", "woman", "is", "was", "playing",
         "guitar", "riding", "horse", "what", "who", "where", "did", "city", "river", "big",
         "small", "red", "blue", "house", "ran", "fast", "slow", "and", "with", "not"]

LABELS = {
    "cola": ["0", "1"], "sst2": ["0", "1"], "mrpc": ["0", "1"], "qqp": ["0", "1"],
    "wnli": ["0", "1"], "rte": ["entailment", "not_entailment"],
    "qnli": ["entailment", "not_entailment"], "mnli": ["contradiction", "entailment", "neutral"],
    "stsb": None,
}


def sentence(rng: random.Random, quoted: bool = False) -> str:
    text = " ".join(rng.choices(WORDS, k=rng.randint(3, 12))) + "."
    # A field that opens with a bare quote and never closes it: QUOTE_NONE keeps the row.
    return f'"{text}' if quoted else text


def _label(task: str, rng: random.Random) -> str:
    labels = LABELS[task]
    return f"{rng.uniform(0, 5):.3f}" if labels is None else rng.choice(labels)


def _rows(task: str, n: int, rng: random.Random, labelled: bool) -> list[list[str]]:
    rows = []
    for i in range(n):
        a, b = sentence(rng, quoted=(i == 1)), sentence(rng, quoted=(i == 2))
        label = _label(task, rng) if labelled else None
        if task == "cola":
            rows.append(["gj04", label, "", a] if labelled else [str(i), a])
        elif task == "sst2":
            rows.append([a, label] if labelled else [str(i), a])
        elif task == "mrpc":
            ids = [str(1000 + i), str(2000 + i)]
            rows.append([label, *ids, a, b] if labelled else [str(i), *ids, a, b])
        elif task == "stsb":
            meta = [str(i), "main-captions", "MSRvid", "2012test", f"{i:04d}"]
            rows.append(meta + ["none", "none", a, b] + ([label] if labelled else []))
        elif task == "qqp":
            rows.append([str(i), str(2 * i), str(2 * i + 1), a, b, label] if labelled
                        else [str(i), a, b])
        elif task == "mnli":
            parses = ["( x )"] * 4
            meta = [str(i), str(100 + i), f"{100 + i}e", "fiction"]
            rows.append(meta + parses + [a, b] + ([label, label] if labelled else []))
        else:  # qnli, rte, wnli
            rows.append([str(i), a, b] + ([label] if labelled else []))
    return rows


HEADERS = {
    "sst2": (["sentence", "label"], ["index", "sentence"]),
    "cola": (None, ["index", "sentence"]),
    "mrpc": (["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
             ["index", "#1 ID", "#2 ID", "#1 String", "#2 String"]),
    "stsb": (["index", "genre", "filename", "year", "old_index", "source1", "source2",
              "sentence1", "sentence2", "score"],
             ["index", "genre", "filename", "year", "old_index", "source1", "source2",
              "sentence1", "sentence2"]),
    "qqp": (["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
            ["id", "question1", "question2"]),
    "mnli": (["index", "promptID", "pairID", "genre", "sentence1_binary_parse",
              "sentence2_binary_parse", "sentence1_parse", "sentence2_parse", "sentence1",
              "sentence2", "label1", "gold_label"],
             ["index", "promptID", "pairID", "genre", "sentence1_binary_parse",
              "sentence2_binary_parse", "sentence1_parse", "sentence2_parse", "sentence1",
              "sentence2"]),
    "qnli": (["index", "question", "sentence", "label"], ["index", "question", "sentence"]),
    "rte": (["index", "sentence1", "sentence2", "label"], ["index", "sentence1", "sentence2"]),
    "wnli": (["index", "sentence1", "sentence2", "label"], ["index", "sentence1", "sentence2"]),
}


def write_tsv(path: Path, header: list[str] | None, rows: list[list[str]], bom: bool = False,
              final_newline: bool = True) -> None:
    lines = ([("\t".join(header))] if header else []) + ["\t".join(row) for row in rows]
    text = ("\ufeff" if bom else "") + "\n".join(lines) + ("\n" if final_newline else "")
    path.write_text(text, encoding="utf-8")


def write_glue_task(task: str, directory: Path, n_train: int, n_dev: int, n_test: int,
                    rng: random.Random) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    labelled_header, test_header = HEADERS[task]
    bom = task == "mrpc"
    dev_files = ["dev_matched.tsv", "dev_mismatched.tsv"] if task == "mnli" else ["dev.tsv"]
    test_files = ["test_matched.tsv", "test_mismatched.tsv"] if task == "mnli" else ["test.tsv"]
    write_tsv(directory / "train.tsv", labelled_header, _rows(task, n_train, rng, True), bom)
    for name in dev_files:
        # CoLA's dev.tsv has no final newline in the real data.
        write_tsv(directory / name, labelled_header, _rows(task, n_dev, rng, True), bom,
                  final_newline=task != "cola")
    for name in test_files:
        write_tsv(directory / name, test_header, _rows(task, n_test, rng, False))
    return directory
