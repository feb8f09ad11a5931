"""What the benchmarks measure with, written once: wall seconds (synchronised on a GPU), the
clocks of a Trainer's steps, the device's name, peak memory, what the training batches held, and
the figures made of them (median over repeats, rates, MFU, ratios)."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import psutil
import torch
from transformers import TrainerCallback

from bertkit.pretraining.masking import IGNORE_INDEX
from bertkit.training.trainer import SEQUENCE_LENGTHS

RSS_SAMPLE_SECONDS = 0.02
T = TypeVar("T")


def synchronize() -> None:
    """Wait for queued GPU work, so that the clock read next covers it (no-op on a CPU)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def synchronized_now() -> float:
    """perf_counter once the GPU work queued so far has run."""
    synchronize()
    return time.perf_counter()


def timed(run: Callable[..., T], *args, sync: bool = True, **kwargs) -> tuple[T, float]:
    """(run(*args, **kwargs)'s result, its wall seconds). sync: the GPU's queue drained at both
    ends, so that the seconds cover its kernels; off for host-only work, where a first sync
    would start CUDA inside the clock."""
    started = synchronized_now() if sync else time.perf_counter()
    result = run(*args, **kwargs)
    return result, (synchronized_now() if sync else time.perf_counter()) - started


def device_name() -> str:
    """The GPU's name (what the peak-FLOPs table matches), else "cpu"."""
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


class PeakMemory:
    """Peak memory while the block runs: CUDA's max_memory_allocated on a GPU; else the
    process's RSS, sampled by a thread (the process peak: it includes what it held before)."""

    def __init__(self):
        self.cuda = torch.cuda.is_available()
        self.kind = ("torch.cuda.max_memory_allocated" if self.cuda else
                     f"process peak RSS during the run (psutil, every {RSS_SAMPLE_SECONDS} s)")
        self.peak = 0
        self._stop = threading.Event()

    def _sample(self) -> None:
        process = psutil.Process()
        while not self._stop.wait(RSS_SAMPLE_SECONDS):
            self.peak = max(self.peak, process.memory_info().rss)

    def __enter__(self):
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        else:
            self.peak = psutil.Process().memory_info().rss
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            self.peak = torch.cuda.max_memory_allocated()
        else:
            self._stop.set()
            self._thread.join()
            self.peak = max(self.peak, psutil.Process().memory_info().rss)


class BatchCounter:
    """Sums what the training steps' batches hold, read from the model's inputs in the training
    process (a forward pre-hook), so that it stays right with dataloader workers, where the
    collator runs in other processes. The token sums stay on the model's device until read: no
    host sync a step."""

    def __init__(self):
        self.shapes: list[tuple[int, int]] = []
        # Each batch's attention blocks: its (rows, width), or a padding-free batch's (sequence
        # slots, phase length), what the sequence-by-sequence attention computes (the
        # variable-length kernel computes less).
        self.blocks: list[tuple[int, int]] = []
        self.sums = None
        self.slots = 0  # the MLM head's rows on bertkit's fixed slots, unused ones included

    def attach(self, model) -> None:
        model.register_forward_pre_hook(self._count, with_kwargs=True)

    @torch.compiler.disable
    def _count(self, module, args, kwargs) -> None:
        if not module.training:
            return
        ids, mask = kwargs["input_ids"], kwargs.get("attention_mask")
        # bertkit's batches: masked slots (mlm_labels, -100 unused), no mask when unpadded.
        slots = kwargs.get("mlm_labels")
        labels = slots if slots is not None else kwargs["labels"]
        packed = kwargs.get(SEQUENCE_LENGTHS)  # a padding-free batch: one row of sequences
        if packed is not None:
            lengths = packed.to(torch.int64)
            sequences = (lengths > 0).sum()
            self.blocks.append((packed.shape[0], int(kwargs["max_sequence_length"])))
        else:
            lengths = mask.sum(dim=1, dtype=torch.int64) if mask is not None \
                else torch.full((ids.shape[0],), ids.shape[1], device=ids.device)
            sequences = torch.full((), ids.shape[0], device=ids.device)
            self.blocks.append(tuple(ids.shape))
        sums = torch.stack([lengths.sum(), (lengths * lengths).sum(),
                            (labels != IGNORE_INDEX).sum(), sequences.to(torch.int64)])
        self.sums = sums if self.sums is None else self.sums + sums
        self.shapes.append(tuple(ids.shape))
        self.slots += slots.numel() if slots is not None else 0

    def totals(self) -> dict[str, int]:
        real, squared, masked, sequences = (self.sums.tolist() if self.sums is not None
                                            else (0, 0, 0, 0))
        return {"sequences": int(sequences), "real_tokens": int(real),
                "positions": sum(rows * width for rows, width in self.shapes),
                "sum_squared_lengths": int(squared),
                "sum_squared_widths": sum(rows * width * width for rows, width in self.blocks),
                "masked_tokens": int(masked), "mlm_slots": self.slots}


class SteadyClock(TrainerCallback):
    """The seconds of the steps after the first `skip`: trainer.train()'s wall time also holds
    the one-time costs (dataloader workers starting, the optimizer's first state, a compile,
    the first plan of each kernel shape), which a short benchmark would charge to every step.
    Two synchronisations a run (at step `skip` and at the last), none in between."""

    def __init__(self, skip: int, steps: int):
        self.skip, self.steps = skip, steps
        self.started: float | None = None
        self.seconds: float | None = None

    def figures(self) -> dict:
        """steady_seconds (None without a skip) and the share of the steps they cover."""
        return {"steady_seconds": self.seconds,
                "steady_share": (self.steps - self.skip) / self.steps}

    def on_step_end(self, args, state, control, **kwargs):
        if self.skip and state.global_step == self.skip:
            self.started = synchronized_now()
        elif state.global_step == state.max_steps and self.started is not None:
            self.seconds = synchronized_now() - self.started


class StepSpan(TrainerCallback):
    """From the first step's start to the last step's end (Trainer's setup and its closing
    log line left out, as a bare loop's optimizer building is), after a synchronisation."""

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == 0:
            self.started = synchronized_now()

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == state.max_steps:
            self.seconds = synchronized_now() - self.started


def steady_skip(bench, steps: int) -> int:
    """bench.steady_skip, or none when the run has too few steps to leave any after it."""
    skip = int(bench.get("steady_skip", 0) or 0)
    return skip if 0 < skip < steps else 0


def steady_figures(runs: list[dict], samples: int, flops: float | None,
                   peak: float | None) -> dict:
    """samples/s and MFU over the steps after steady_skip (median over repeats), counted in
    proportion to the steps: every step of a run feeds one batch of the same width."""
    if any(run.get("steady_seconds") is None for run in runs):
        return {"steady_samples_per_second": None, "steady_mfu": None}
    share = runs[0]["steady_share"]
    seconds = statistics.median(run["steady_seconds"] for run in runs)
    return {"steady_samples_per_second": samples * share / seconds,
            "steady_mfu": utilisation(flops and flops * share, seconds, peak)}


def median_seconds(each_repeat: list[float]) -> dict:
    """A way's (or stage's) seconds: the median over its repeats (what the rates use), and each
    repeat's."""
    return {"seconds": statistics.median(each_repeat), "seconds_each_repeat": list(each_repeat)}


def utilisation(flops: float | None, seconds: float, peak: float | None) -> float | None:
    """FLOPs over seconds x the device's peak FLOP/s (MFU, HFU); None without either."""
    return flops / (seconds * peak) if flops and peak else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None where either figure is missing (or zero)."""
    return numerator / denominator if numerator and denominator else None
