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
                    writer of the score marks it, bertkit.data.limited_samples); and
                    what the run read by content, for bertkit-report's run identity:
                    data_fingerprint (the splits) and input_fingerprints ({config key:
                    fingerprint} of a local checkpoint, tokenizer or corpus; a pretraining
                    run's metrics.json has them in its details too)

Files of schema 1 (no schema_version: SQuAD and SWAG wrote dev scores flat, without the split)
are read through `upgrade`. Pretraining runs write a metrics.json of their own (no main_metric),
whose details.limited_samples names the parts a pretraining run cut
(bertkit.data.limited_samples.PRETRAINING_CUTS): "corpus" when reading stopped at
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
