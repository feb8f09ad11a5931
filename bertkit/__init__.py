"""bertkit: BERT pretraining and finetuning experiments on Hugging Face Trainer."""

__version__ = "0.1.0"
