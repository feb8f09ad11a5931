"""The run lifecycle every family goes through, one module per idea: the steps a job makes and what
a run is started with: TrainingArguments, the launch, progress bars (run.py), the one finetune
job (finetune.py), the one Trainer, its static shapes and compiling (trainer.py), when a run
stops and the checkpoints it can resume from (stop_and_resume.py), what it costs
(throughput.py), its model card (model_card.py), models and tokenizers (models.py) and W&B
(wandb_logging.py).

Imports `bertkit.data` only; it knows no task family (a family hands it a spec).
"""
