"""SQuAD v1.1 / v2.0 examples from the official JSON files or the Hub, in one schema.

The schema is the Hub's (rajpurkar/squad, rajpurkar/squad_v2): columns id, title, context,
question, answers {"text": [...], "answer_start": [...]}; an unanswerable v2.0 question has
empty lists. Why our own reader and not `datasets.load_dataset("json")`: the official files
nest questions three levels deep, and every bad record must be reported with its file, its
JSON location (`data[3].paragraphs[1].qas[0]`) and its question id.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import datasets

from bertkit.data.atomic_files import read_utf8
from bertkit.data.task_data import load_hub_dataset
from bertkit.errors import BertkitError

logger = logging.getLogger(__name__)

VERSIONS = ("v1.1", "v2.0")
BAD_ANSWER_START_ACTIONS = ("error", "warn")
HUB_DATASETS = {"squad": "rajpurkar/squad", "squad_v2": "rajpurkar/squad_v2"}
COLUMNS = ("id", "title", "context", "question", "answers")
FEATURES = datasets.Features({
    "id": datasets.Value("string"),
    "title": datasets.Value("string"),
    "context": datasets.Value("string"),
    "question": datasets.Value("string"),
    "answers": datasets.Sequence(
        {"text": datasets.Value("string"), "answer_start": datasets.Value("int32")}
    ),
})
# How many bad answer_start locations a "warn" message lists before it only counts.
_LISTED = 5


def _load_json(path: Path):
    try:
        return json.loads(read_utf8(path))
    except json.JSONDecodeError as err:
        raise BertkitError(
            f"{path}, line {err.lineno}, column {err.colno}: not valid JSON ({err.msg})"
        ) from None


def _field(path: Path, record: dict, key: str, kind: type, where: str, qid: str | None = None):
    """record[key], checked to be present and of the expected JSON type."""
    label = f"{where} (question id {qid!r})" if qid is not None else where
    if not isinstance(record, dict):
        raise BertkitError(f"{path}: {label} is a {type(record).__name__}, expected an object")
    if key not in record:
        raise BertkitError(f"{path}: {label} has no {key!r} key")
    value = record[key]
    # bool is an int in Python; JSON true is not an answer_start.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        expected = {str: "a string", int: "an integer", list: "a list", bool: "true or false"}
        raise BertkitError(
            f"{path}: {label}.{key} is {json.dumps(value)[:60]}, expected {expected[kind]}"
        )
    return value


def _answers(path, qa, where, qid, context, version, bad_starts):
    """The question's answers as (texts, starts), checked against the version's rules."""
    answers = _field(path, qa, "answers", list, where, qid)
    texts, starts = [], []
    for i, answer in enumerate(answers):
        answer_where = f"{where}.answers[{i}]"
        text = _field(path, answer, "text", str, answer_where, qid)
        start = _field(path, answer, "answer_start", int, answer_where, qid)
        if not (0 <= start and context[start:start + len(text)] == text):
            found = context[max(start, 0):max(start, 0) + len(text)]
            bad_starts.append(
                f"{answer_where} (question id {qid!r}): answer_start {start} points at "
                f"{found!r} in the context, not at the answer text {text!r}"
            )
        texts.append(text)
        starts.append(start)
    if version == "v1.1":
        if not texts:
            raise BertkitError(
                f"{path}: {where} (question id {qid!r}) has no answers; every v1.1 question "
                f"has at least one (is this a v2.0 file? then read it as version v2.0)"
            )
        return texts, starts
    # evaluate-v2.0.py never reads is_impossible, only whether answers is empty: when the key
    # is absent, the answers decide. plausible_answers (official v2.0 files) are not answers.
    if "is_impossible" in qa:
        impossible = _field(path, qa, "is_impossible", bool, where, qid)
        if impossible and texts:
            raise BertkitError(
                f"{path}: {where} (question id {qid!r}) has is_impossible true but "
                f"{len(texts)} answers; expected none (guesses belong in plausible_answers)"
            )
        if not impossible and not texts:
            raise BertkitError(
                f"{path}: {where} (question id {qid!r}) has is_impossible false but no answers; "
                f"expected at least one"
            )
    return texts, starts


def read_squad_json(
    path: str | Path, *, version: str, on_bad_answer_start: str = "error"
) -> datasets.Dataset:
    """Read an official SQuAD file (train/dev-v1.1.json, train/dev-v2.0.json), in file order.

    An answer whose answer_start does not point at its text in the context raises with
    on_bad_answer_start="error" (for training: its span would be wrong; Google's run_squad.py
    cannot place it either). With "warn" it is kept and logged: use it for evaluation data,
    since the official evaluation scripts only compare answer texts and never read
    answer_start, and a dropped question would leave the metric's denominator.
    """
    path = Path(path)
    if version not in VERSIONS:
        raise BertkitError(f"SQuAD version {version!r}: expected one of {', '.join(VERSIONS)}")
    if on_bad_answer_start not in BAD_ANSWER_START_ACTIONS:
        raise BertkitError(
            f"on_bad_answer_start={on_bad_answer_start!r}: expected "
            f"{' or '.join(BAD_ANSWER_START_ACTIONS)}"
        )
    if not path.is_file():
        raise BertkitError(f"{path}: file not found")
    dataset = _load_json(path)
    if not isinstance(dataset, dict):
        raise BertkitError(f"{path}: the top level is a {type(dataset).__name__}, expected an "
                           f"object with 'version' and 'data' keys (the official SQuAD layout)")
    file_version = dataset.get("version")
    if file_version is not None and str(file_version).lstrip("v") != version.lstrip("v"):
        # evaluate-v1.1.py only warns about this too; the per-question rules catch real misuse.
        logger.warning("%s: the file says version %s, read as SQuAD %s", path, file_version,
                       version)

    columns: dict[str, list] = {name: [] for name in COLUMNS}
    where_of_id: dict[str, str] = {}
    bad_starts: list[str] = []
    for a, article in enumerate(_field(path, dataset, "data", list, "the top level")):
        article_where = f"data[{a}]"
        title = _field(path, article, "title", str, article_where)
        paragraphs = _field(path, article, "paragraphs", list, article_where)
        for p, paragraph in enumerate(paragraphs):
            paragraph_where = f"{article_where}.paragraphs[{p}]"
            context = _field(path, paragraph, "context", str, paragraph_where)
            for q, qa in enumerate(_field(path, paragraph, "qas", list, paragraph_where)):
                where = f"{paragraph_where}.qas[{q}]"
                qid = _field(path, qa, "id", str, where)
                if qid in where_of_id:
                    raise BertkitError(f"{path}: {where} has question id {qid!r}, which "
                                       f"{where_of_id[qid]} already has; ids must be unique")
                where_of_id[qid] = where
                question = _field(path, qa, "question", str, where, qid)
                texts, starts = _answers(path, qa, where, qid, context, version, bad_starts)
                columns["id"].append(qid)
                columns["title"].append(title)
                columns["context"].append(context)
                columns["question"].append(question)
                columns["answers"].append({"text": texts, "answer_start": starts})
    if bad_starts and on_bad_answer_start == "error":
        raise BertkitError(
            f"{path}: {bad_starts[0]}"
            + (f" (and {len(bad_starts) - 1} more such answers)" if len(bad_starts) > 1 else "")
            + "; for evaluation files, where only answer texts count, use "
            "on_bad_answer_start='warn' to keep them"
        )
    if bad_starts:
        listed = "; ".join(bad_starts[:_LISTED])
        more = f"; and {len(bad_starts) - _LISTED} more" if len(bad_starts) > _LISTED else ""
        logger.warning("%s: kept %d answers whose answer_start does not match their text "
                       "(the evaluation compares texts only): %s%s",
                       path, len(bad_starts), listed, more)
    if not columns["id"]:
        raise BertkitError(f"{path}: no questions")
    return datasets.Dataset.from_dict(columns, features=FEATURES)


def squad_from_hub(name: str, split: str) -> datasets.Dataset:
    """One split of rajpurkar/squad or rajpurkar/squad_v2 (name: "squad", "squad_v2" or the
    full Hub path), with a message that points to the local files when the Hub is out of reach."""
    hub_path = HUB_DATASETS.get(name, name)
    v2 = hub_path.endswith("squad_v2")
    train, dev = ("train-v2.0.json", "dev-v2.0.json") if v2 else ("train-v1.1.json",
                                                                  "dev-v1.1.json")
    table = load_hub_dataset(
        f"split {split!r} of the Hub dataset {hub_path}",
        f"give the original JSON files: task.train_file=<path to {train}> "
        f"task.validation_file=<path to {dev}>",
        hub_path, split=split)
    missing = [column for column in COLUMNS if column not in table.column_names]
    if missing:
        raise BertkitError(
            f"the Hub dataset {hub_path} ({split}) has no column(s) {', '.join(missing)}; "
            f"expected the SQuAD columns {', '.join(COLUMNS)}"
        )
    return table.select_columns(list(COLUMNS))
