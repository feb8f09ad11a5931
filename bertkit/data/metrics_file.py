"""metrics.json: one schema for every task family, written by the finetune job and
read by bertkit-report without family-specific patches.

    schema_version  2
    recipe, family, task, model, seed     what the run was
    main_metric, main_value               the task's headline dev score (what the report ranks)
    validation      {split: {metric: value}}  dev splits (GLUE MNLI has two)
    test            {split: {metric: value}}  labelled test splits (CoNLL-2003), else {}
    train           loss, steps, epochs (really trained: fractional, below num_train_epochs
                    when max_steps or a stop ended the run first), planned_steps, complete,
                    seconds, training_seconds (across resumes), budget (with budget.minutes),
                    and the family's sizes
    hyperparameters the paper's names (learning_rate, train_batch_size, ...) and the family's
    files           name -> path of the prediction files
    details         the family's own facts (data counts, decoding time, best checkpoint);
                    limited_samples, the splits cut to their first examples by
                    task.max_*_samples ({split: {examples, of}}: no result on the task; every
                    writer of the score marks it, below); and
                    what the run read by content, for bertkit-report's run identity:
                    data_fingerprint (the splits) and input_fingerprints ({config key:
                    fingerprint} of a local checkpoint, tokenizer or corpus; a pretraining
                    run's metrics.json has them in its details too)

Files of schema 1 (no schema_version: SQuAD and SWAG wrote dev scores flat, without the split)
are read through `upgrade`. Pretraining runs write a metrics.json of their own (no main_metric),
whose details.limited_samples names the parts a pretraining run cut
(PRETRAINING_CUTS, below): "corpus" when reading stopped at
corpus.max_documents ({"examples": documents read, "of": null}: the whole is not counted).
heldout.max_sequences is not a cut: it sizes the held-out sample every arm is scored on.
corpus.max_documents counts because the held-out set is drawn
from the documents read: a run on the first N documents (debug=smoke: 16) is scored on a few
held-out documents of that small corpus, no result on the corpus its card and W&B run name.
Two-stage finetuning's target names its first stage's cut splits as intermediate/<split>.
"""

from __future__ import annotations

SCHEMA_VERSION = 2
METRICS_FILE = "metrics.json"
FAILED_FILE = "failed.json"
INPUT_FINGERPRINTS = "input_fingerprints"  # details' {config key: fingerprint}


def metrics_record(*, header: dict, validation: dict, test: dict | None, train: dict,
                   hyperparameters: dict, files: dict | None = None,
                   details: dict | None = None) -> dict:
    return {"schema_version": SCHEMA_VERSION, **header, "validation": validation,
            "test": test or {}, "train": train, "hyperparameters": hyperparameters,
            "files": files or {}, "details": details or {}}


def upgrade(data: dict) -> dict:
    """A metrics.json of any schema as schema 2. Schema 1 differs in "validation" only, which
    SQuAD and SWAG wrote flat ({metric: value}): it becomes {"validation": {...}}."""
    if data.get("schema_version", 1) >= SCHEMA_VERSION:
        return data
    validation = data.get("validation")
    if isinstance(validation, dict) and not all(isinstance(v, dict)
                                                for v in validation.values()):
        nested = {k: v for k, v in validation.items() if isinstance(v, dict)}
        flat = {k: v for k, v in validation.items() if not isinstance(v, dict)}
        data = {**data, "validation": {**nested, "validation": flat}}
    return {**data, "schema_version": SCHEMA_VERSION}


# ================================================================================================
# Scores on part of the data: metrics.json's details.limited_samples, {part: {"examples": N,
# "of": M}}, and how every writer of a score names it (metrics.json, the model card, W&B's tags
# and group, the printout; bertkit-report reads the same key).
#
# A part is a finetune's split cut by task.max_*_samples (its name: train, validation_matched,
# ...), the first stage's split of a two-stage run (intermediate/<split>), or a pretraining run's
# corpus (PRETRAINING_CUTS). "of" is null where the whole is not counted
# (corpus.max_documents stops reading the corpus at N documents). A run with any part cut is no
# result on its task or corpus, wherever its score is shown.

LIMITED_SAMPLES = "limited_samples"  # the key in metrics.json's details
INTERMEDIATE_PREFIX = "intermediate/"  # two-stage finetuning's first stage's splits

# A pretraining run's parts that a setting cuts: part -> (the setting, what it counts).
# corpus.max_documents counts: the held-out set is drawn from the documents read, so a run on
# the first N documents (debug=smoke: 16) is scored on a held-out set of that small corpus, not
# on the corpus the card and W&B name.
# heldout.max_sequences is no cut: it sizes the held-out sample every arm is scored on.
PRETRAINING_CUTS = {"corpus": ("corpus.max_documents", "documents")}


def limited_samples(record: dict) -> dict[str, dict]:
    """The cut parts of a metrics.json record ({} for a run on all the data)."""
    return (record.get("details") or {}).get(LIMITED_SAMPLES) or {}


def cut(examples: int, of: int | None) -> dict | None:
    """A part's entry when `examples` of `of` is a cut (of None: not counted, a cut), else
    None (a limit at or above the part's size cuts nothing)."""
    if of is not None and examples >= of:
        return None
    return {"examples": examples, "of": of}


def cut_setting(part: str) -> tuple[str, str]:
    """(the setting that cut `part`, what its numbers count)."""
    # Imported here: task_data imports datasets, and the CLI reads this module (FAILED_FILE).
    from bertkit.data.task_data import sample_limit_key

    if part in PRETRAINING_CUTS:
        return PRETRAINING_CUTS[part]
    split = part.removeprefix(INTERMEDIATE_PREFIX)
    where = "finetuning.intermediate's " if part != split else ""
    try:
        return f"{where}task.{sample_limit_key(split)}", "examples"
    except ValueError:
        return "a sample limit", "examples"


def describe_cut(part: str, entry: dict) -> str:
    """One part in words: "validation: the first 16 of 277 examples (task.max_eval_samples)"."""
    setting, unit = cut_setting(part)
    whole = f" of {entry['of']}" if entry.get("of") is not None else ""
    return f"{part}: the first {entry['examples']}{whole} {unit} ({setting})"


def cut_line(limited: dict[str, dict], what: str) -> str:
    """A printout's line for a run on part of its data (empty for a run on all of it)."""
    if not limited:
        return ""
    return (f"  part of the data only, no result on {what}: "
            + "; ".join(describe_cut(part, entry) for part, entry in limited.items()) + "\n")
