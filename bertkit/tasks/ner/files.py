"""CoNLL-2003 NER data from files in the CoNLL column format or from the Hub, as sentences of
(token, IOB2 tag) with the document each sentence belongs to.

Why our own reader: the document boundaries (`-DOCSTART-` lines) must survive for document
context, the tag scheme of the file must be known (the original release is IOB1, most copies
IOB2), and a bad line must be reported with its file and line number.

IOB1 (I- may start an entity; B- only starts an entity right after one of the same type) is
converted to IOB2 (B- starts every entity). A sequence without an I- that starts an entity
reads the same in both schemes, so converting never changes IOB2 data.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bertkit.data.atomic_files import read_utf8
from bertkit.data.task_data import load_hub_dataset
from bertkit.errors import BertkitError

logger = logging.getLogger(__name__)

TAG_SCHEMES = ("auto", "iob1", "iob2")  # task.tag_scheme's choices (config_schema)
DOCSTART = "-DOCSTART-"
# Document id of sentences whose document is unknown (Hub data without document boundaries).
NO_DOCUMENT = -1


@dataclass
class ConllSentences:
    """Sentences in file order: words, IOB2 tags, document id (0, 1, ... in file order) and
    the line (or Hub row) each sentence starts at; scheme: the tag scheme the source was in."""

    tokens: list[list[str]] = field(default_factory=list)
    tags: list[list[str]] = field(default_factory=list)
    documents: list[int] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    scheme: str = "iob2"


def inside_starts_entity(tags: Sequence[str], i: int) -> bool:
    """Whether tags[i] is an I-X that does not continue an entity of type X (IOB1 only)."""
    tag = tags[i]
    if not tag.startswith("I-"):
        return False
    previous = tags[i - 1] if i > 0 else "O"
    return previous == "O" or previous[2:] != tag[2:]


def iob1_to_iob2(tags: Sequence[str]) -> list[str]:
    """An I-X that starts an entity becomes B-X; everything else is kept (B-X already starts
    one in both schemes)."""
    return [f"B-{tag[2:]}" if inside_starts_entity(tags, i) else tag
            for i, tag in enumerate(tags)]


def _to_iob2(sentences: ConllSentences, scheme: str, where: str, positions: str) -> None:
    """Convert sentences.tags to IOB2 in place and record the scheme they were in.

    auto: IOB1 when any I- starts an entity. iob2: such an I- is an error, naming the line."""
    first = next(((s, i) for s, tags in enumerate(sentences.tags) for i in range(len(tags))
                  if inside_starts_entity(tags, i)), None)
    if first is None:
        sentences.scheme = "iob2" if scheme == "auto" else scheme
        return
    s, i = first
    if scheme == "iob2":
        position = sentences.lines[s] + i if positions == "line" else sentences.lines[s]
        raise BertkitError(
            f"{where}, {positions} {position}: tag {sentences.tags[s][i]!r} starts an entity, "
            f"which IOB2 does not allow (B- starts every entity): the data looks like IOB1; "
            f"set task.tag_scheme=iob1 or auto")
    if scheme == "auto":
        position = sentences.lines[s] + i if positions == "line" else sentences.lines[s]
        logger.info("%s: read as IOB1 (%s %d: %s starts an entity) and converted to IOB2",
                    where, positions, position, sentences.tags[s][i])
    sentences.scheme = "iob1"
    sentences.tags = [iob1_to_iob2(tags) for tags in sentences.tags]


def read_conll_file(
    path: str | Path,
    *,
    labels: Sequence[str],
    tag_scheme: str = "auto",
    num_columns: int = 4,
    token_column: int = 0,
    tag_column: int = 3,
) -> ConllSentences:
    """Read a CoNLL column file: one `token ... tag` line per word (white-space separated,
    exactly num_columns fields), a blank line between sentences, `-DOCSTART-` lines starting
    documents. Tags must be task labels; they are returned in IOB2."""
    path = Path(path)
    if not path.is_file():
        raise BertkitError(f"{path}: file not found")
    for key, column in (("token", token_column), ("tag", tag_column)):
        if not -num_columns <= column < num_columns:
            raise BertkitError(f"task.columns.{key}={column}: no such column in a line of "
                               f"task.columns.count={num_columns} fields")
    known = set(labels)
    out = ConllSentences()
    words: list[str] = []
    tags: list[str] = []
    document, document_has_sentences, start_line = 0, False, 0

    def end_sentence() -> None:
        nonlocal words, tags, document_has_sentences
        if words:
            out.tokens.append(words)
            out.tags.append(tags)
            out.documents.append(document)
            out.lines.append(start_line)
            document_has_sentences = True
        words, tags = [], []

    for number, line in enumerate(read_utf8(path).split("\n"), start=1):
        fields = line.split()
        if not fields:
            end_sentence()
            continue
        if fields[0] == DOCSTART:
            end_sentence()
            if document_has_sentences:
                document, document_has_sentences = document + 1, False
            continue
        if len(fields) != num_columns:
            raise BertkitError(
                f"{path}, line {number}: {len(fields)} white-space separated fields, expected "
                f"{num_columns} (token, ..., NER tag; task.columns.count): {line.strip()[:80]!r}")
        tag = fields[tag_column]
        if tag not in known:
            raise BertkitError(f"{path}, line {number}: tag {tag!r} is not one of the task's "
                               f"labels {list(labels)} (task.labels)")
        if not words:
            start_line = number
        words.append(fields[token_column])
        tags.append(tag)
    end_sentence()
    if not out.tokens:
        raise BertkitError(f"{path}: no sentences (expected `token ... tag` lines, a blank "
                           f"line between sentences)")
    _to_iob2(out, tag_scheme, str(path), "line")
    return out


def conll_from_hub(
    path: str,
    name: str | None,
    *,
    labels: Sequence[str],
    tag_scheme: str = "auto",
    tokens_column: str = "tokens",
    tags_column: str = "ner_tags",
    document_column: str | None = None,
    tag_names: Sequence[str] | None = None,
    revision: str | None = None,
) -> dict[str, ConllSentences]:
    """Every split of a Hub dataset with a tokens column and a tags column: class ids named by
    the dataset's features (ClassLabel), else by tag_names, or tag strings. Hub copies of
    CoNLL-2003 drop the -DOCSTART- lines: without document_column, documents are unknown
    (NO_DOCUMENT)."""

    where = f"the Hub dataset {path}" + (f"/{name}" if name else "")
    raw = load_hub_dataset(
        where,
        "give the files in the CoNLL format: task.data_dir=<dir with train.txt, valid.txt, "
        "test.txt> or task.train_file= / task.validation_file= [/ task.test_file=]; online, "
        "another copy with task.hub.path= (task.hub.revision=, task.hub.tag_names=)",
        path, name, **({"revision": revision} if revision else {}))
    known = set(labels)
    splits = {}
    for split, table in raw.items():
        missing = [c for c in (tokens_column, tags_column, document_column)
                   if c and c not in table.column_names]
        if missing:
            raise BertkitError(f"{where} ({split}) has no column(s) {', '.join(missing)} "
                               f"(task.hub.columns); it has {', '.join(table.column_names)}")
        feature = table.features[tags_column]
        names = getattr(getattr(feature, "feature", None), "names", None)
        if names is None and tag_names is not None:
            names = list(tag_names)
        out = ConllSentences()
        documents = table[document_column] if document_column else None
        document_ids: dict = {}  # the column's values (numbers or names) -> 0, 1, ...
        for row, (tokens, tags) in enumerate(zip(table[tokens_column], table[tags_column],
                                                 strict=True)):
            if not tokens:
                continue
            if names is not None and any(isinstance(t, int) and not 0 <= t < len(names)
                                         for t in tags):
                raise BertkitError(f"{where} ({split}), row {row}: class id out of range of "
                                   f"the tag names {names}")
            tags = [names[t] if isinstance(t, int) and names is not None else t for t in tags]
            if any(not isinstance(t, str) for t in tags):
                raise BertkitError(f"{where} ({split}): {tags_column} holds class ids without "
                                   f"names (no ClassLabel feature): set task.hub.tag_names")
            unknown = next((t for t in tags if t not in known), None)
            if unknown is not None:
                raise BertkitError(f"{where} ({split}), row {row}: tag {unknown!r} is not one "
                                   f"of the task's labels {list(labels)} (task.labels)")
            out.tokens.append(list(tokens))
            out.tags.append(tags)
            out.documents.append(NO_DOCUMENT if documents is None else
                                 document_ids.setdefault(documents[row], len(document_ids)))
            out.lines.append(row)
        _to_iob2(out, tag_scheme, f"{where} ({split})", "row")
        splits[split] = out
    return splits
