"""Trainer for MLM + NSP/SOP pretraining: logs each objective's loss and accuracy separately,
the share of real (non-padding) tokens, the current sequence length, and samples in the
paper's sequence-length phases, padded (PhasedSampler) or padding-free (PackedBatches,
bertkit.pretraining.batches).

Statistics are summed over the steps between two log lines and over all processes, so the
logged MLM loss is the mean over every masked token of the window, not a mean of means.

The one subclass of bertkit's Trainer (bertkit.training.trainer.BertkitTrainer), because its
three changes share the window's state: the loss read with the statistics from the model's
own outputs, the log lines that sum them, and the phases' sampler. As callables handed to
BertkitTrainer they would need three hooks and a state object between them, in training/,
which must not know pretraining.
"""

from __future__ import annotations

import datasets
import torch

from bertkit.pretraining.batches import (
    IGNORE_INDEX,
    MAX_LENGTH,
    SEQUENCE_LENGTHS,
    ArrowRows,
    PackedBatches,
    PackingPlan,
    Phase,
    PhasedSampler,
)
from bertkit.training.trainer import BertkitTrainer

# The instance columns the collators read (the rest, e.g. "length", is not fetched).
MODEL_COLUMNS = ("input_ids", "token_type_ids", "next_sentence_label", "labels")
STATISTICS = ("mlm_loss_sum", "mlm_correct", "mlm_count", "sentence_loss_sum",
              "sentence_correct", "sentence_count", "real_tokens", "batch_tokens")


class PretrainingTrainer(BertkitTrainer):
    def __init__(self, *args, phases: list[Phase] | None = None,
                 sentence_task: str | None = "nsp", group_by_length: bool = True,
                 packing: PackingPlan | None = None, **kwargs):
        """group_by_length: the padded batches' order (bertkit.pretraining.batches); packing:
        padding-free batches, in a plain shuffle."""
        train_dataset = kwargs.get("train_dataset")
        if isinstance(train_dataset, datasets.Dataset):  # batches as Arrow tables
            kwargs["train_dataset"] = ArrowRows(train_dataset.remove_columns(
                [name for name in train_dataset.column_names if name not in MODEL_COLUMNS]))
        super().__init__(*args, **kwargs)
        self.phases = phases
        self.sentence_task = sentence_task
        self.group_by_length = group_by_length
        self.packing = packing
        self._window: dict[str, torch.Tensor] = {}
        self._longest_in_window = 0
        self._run_tokens: dict[str, torch.Tensor] = {}  # real and fed positions, the whole run

    def running_totals(self) -> dict:
        """Trainer's loss sums, and this trainer's log window and padding counts under way
        (each process's own; under DDP a checkpoint carries the main process's)."""
        return {**super().running_totals(),
                "statistics": {name: value.item() for name, value in self._window.items()},
                "longest_in_window": int(self._longest_in_window),
                "run_tokens": {name: value.item() for name, value in self._run_tokens.items()}}

    def gather_running_totals(self) -> None:
        """The log window's statistics are summed over processes when logged: before a save,
        the main process takes the sums of all (the others none), so that the checkpoint it
        saves carries the whole window and the next log line is unchanged."""
        super().gather_running_totals()
        if not self._window:
            return
        names = sorted(self._window)
        sums = self.accelerator.reduce(torch.stack([self._window[name] for name in names]),
                                       reduction="sum")
        if not self.accelerator.is_main_process:
            sums = torch.zeros_like(sums)
        self._window = dict(zip(names, sums, strict=True))
        longest = torch.tensor(float(self._longest_in_window), device=sums.device)
        self._longest_in_window = int(self.accelerator.reduce(longest, reduction="max").item())

    def restore_running_totals(self, totals: dict) -> None:
        super().restore_running_totals(totals)
        device = self.args.device
        # The window's statistics on the main process only: they are summed over processes.
        statistics = totals.get("statistics", {}) if self.accelerator.is_main_process else {}
        self._window = {name: torch.tensor(value, dtype=torch.float64, device=device)
                        for name, value in statistics.items()}
        self._longest_in_window = int(totals.get("longest_in_window", 0))
        self._run_tokens = {name: torch.tensor(value, dtype=torch.float64, device=device)
                            for name, value in totals.get("run_tokens", {}).items()}

    def _get_train_sampler(self, train_dataset=None):
        if self.phases is None:
            return super()._get_train_sampler(train_dataset)
        seed = self.args.data_seed or self.args.seed
        if self.packing is not None:
            rows = self.args.per_device_train_batch_size
            return PackedBatches(self.phases, self.packing.shapes, self.packing.predictions,
                                 [phase.num_samples // rows for phase in self.phases], seed,
                                 rank=self.args.process_index, world_size=self.args.world_size)
        # Grouped by the whole batch (every process's rows of every accumulation step), as
        # BertkitTrainer's length grouping: a batch holds a one-process run's examples.
        whole_batch = (self.args.per_device_train_batch_size
                       * self.args.gradient_accumulation_steps * self.args.world_size)
        return PhasedSampler(self.phases, whole_batch, seed=seed,
                             group_by_length=self.group_by_length)

    @property
    def padding_fraction(self) -> float | None:
        """The share of the positions fed in training that were padding (the whole run:
        carried across resumes, running_totals); None before any step."""
        if not self._run_tokens:
            return None
        real, fed = (self._run_tokens[name].item() for name in ("real_tokens", "batch_tokens"))
        return 1.0 - real / max(fed, 1.0)

    def _get_num_items_in_batch(self, batch_samples: list, device: torch.device):
        """The whole batch's masked tokens and scored sentences (its micro-batches on every
        process), as [mlm, sentence], in training; None in evaluation. Each loss term is a
        mean over its own items (BertkitTrainer's loss_items: one count would not do)."""
        if not self.model.training or not batch_samples:
            return None
        counts = torch.zeros(2, dtype=torch.int64, device=device)
        for batch in batch_samples:
            masked = batch["mlm_labels"] if "mlm_labels" in batch else batch["labels"]
            sentences = batch.get("next_sentence_label")
            counts[0] += (masked != IGNORE_INDEX).sum().to(device)
            if sentences is not None:
                counts[1] += (sentences != IGNORE_INDEX).sum().to(device)
        if self.accelerator.num_processes > 1:
            counts = self.accelerator.reduce(counts, reduction="sum")
        return counts

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs)
        if num_items_in_batch is not None:  # each term weighed by its share of the batch's
            processes = self.accelerator.num_processes
            whole = num_items_in_batch.clamp(min=1)
            sentences = 0 if outputs.sentence_count is None else outputs.sentence_count
            outputs.loss = (outputs.mlm_loss * (outputs.mlm_count * processes / whole[0])
                            + outputs.sentence_loss * (sentences * processes / whole[1]))
        if model.training:
            mask = inputs.get("attention_mask")
            batch = {name: outputs[name] for name in STATISTICS[:6]
                     if outputs.get(name) is not None}
            ids = inputs["input_ids"]
            # torch.full fills on the device: no copy from the host, no wait for it.
            batch["batch_tokens"] = torch.full((), ids.numel(), device=ids.device)
            if SEQUENCE_LENGTHS in inputs:  # padding-free: the sequences' tokens
                batch["real_tokens"] = inputs[SEQUENCE_LENGTHS].sum()
            else:
                batch["real_tokens"] = mask.sum() if mask is not None else batch["batch_tokens"]
            for name, value in batch.items():
                value = value.detach().to(torch.float64)
                self._window[name] = self._window[name] + value if name in self._window \
                    else value
                if name in ("real_tokens", "batch_tokens"):
                    self._run_tokens[name] = self._run_tokens.get(name, 0) + value
            self._longest_in_window = max(self._longest_in_window,
                                          inputs.get(MAX_LENGTH, ids.shape[1]))
        return (outputs.loss, outputs) if return_outputs else outputs.loss

    def _window_statistics(self) -> dict[str, float]:
        """The window's sums over all processes, as the values W&B shows."""
        if not self._window:
            return {}
        names = [name for name in STATISTICS if name in self._window]
        sums = torch.stack([self._window[name] for name in names])
        longest = torch.tensor([float(self._longest_in_window)], dtype=torch.float64,
                               device=sums.device)
        if self.accelerator.num_processes > 1:
            sums = self.accelerator.reduce(sums, reduction="sum")
            longest = self.accelerator.reduce(longest, reduction="max")
        total = dict(zip(names, sums.tolist(), strict=True))
        self._window = {}
        self._longest_in_window = 0
        logs = {
            "mlm_loss": total["mlm_loss_sum"] / max(total["mlm_count"], 1),
            "mlm_accuracy": total["mlm_correct"] / max(total["mlm_count"], 1),
            "real_token_share": total["real_tokens"] / max(total["batch_tokens"], 1),
            "longest_sequence": longest.item(),
        }
        if "sentence_count" in total and self.sentence_task:
            count = max(total["sentence_count"], 1)
            logs[f"{self.sentence_task}_loss"] = total["sentence_loss_sum"] / count
            logs[f"{self.sentence_task}_accuracy"] = total["sentence_correct"] / count
        return logs

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs:  # a training log line (evaluation lines carry eval_loss)
            logs = {**logs, **self._window_statistics()}
        super().log(logs, start_time)
