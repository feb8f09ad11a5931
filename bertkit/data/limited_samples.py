"""Scores on part of the data: metrics.json's details.limited_samples, {part: {"examples": N,
"of": M}}, and how every writer of a score names it (metrics.json, the model card, W&B's tags
and group, the printout; bertkit-report reads the same key).

A part is a finetune's split cut by task.max_*_samples (its name: train, validation_matched,
...), the first stage's split of a two-stage run (intermediate/<split>), or a pretraining run's
corpus (PRETRAINING_CUTS). "of" is null where the whole is not counted
(corpus.max_documents stops reading the corpus at N documents). A run with any part cut is no
result on its task or corpus, wherever its score is shown.
"""

from __future__ import annotations

from bertkit.data.task_data import sample_limit_key

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
