"""The run lifecycle every family goes through: TrainingArguments from the config, the one
finetune template (finetune.py), training with early stopping / train_fraction / resume /
a time budget (clock.py, budget.py), the W&B run, models and tokenizers, the length-grouped
Trainer, and distributed helpers.

Imports `bertkit.data` only; it knows no task family (a family hands it a spec).
"""
