"""The bench_glue family: training throughput of one GLUE task padded two ways.

  plain:   what run_glue.py does by default: every example padded to a fixed length when the
           data is tokenised (padding="max_length"), batches drawn at random, plain Trainer with
           default_data_collator;
  bertkit: what `recipe=glue` does: each batch padded to its own longest example rounded up
           to a multiple of bucket_width by DataCollatorWithPadding (and of
           pad_to_multiple_of under mixed precision), batches in
           trainer.train_sampling_strategy's order (random by default; group_by_length:
           batches of similar length, LengthGroupedTrainer).

Both ways train the same model from the same initial weights (same seed and config), with the
same batch size, learning rate and number of optimizer steps, on the same tokenised examples
(the same truncation; the plain way only adds padding), each drawn in its own way's order.
Each way first runs bench.warmup_steps steps on
a throwaway copy (not timed), then bench.steps timed steps from the start, so that the timed
run sees the first batches of an epoch just as a real run does. Only trainer.train() is timed.
The padding share is counted from the batches the collator actually built for the timed steps.
Real tokens/s, FLOPs and MFU (on a GPU of throughput.peak_tflops) come from the throughput
meter every bertkit run carries (bertkit.training.throughput), attached to both ways' trainers:
MFU counts the useful FLOPs on real tokens for both, so the padding the plain way computes
lowers its MFU. Peak memory is per run on a GPU (reset before each); on a CPU the process's
peak cannot be told apart by run, so it is left out.

Writes bench.json in the run directory and prints a table.
"""

from __future__ import annotations

import functools
import gc
import logging
import statistics
import time
from pathlib import Path

import datasets
import torch
from omegaconf import DictConfig, OmegaConf
from transformers import (
    DataCollatorWithPadding,
    PreTrainedTokenizerBase,
    PrinterCallback,
    Trainer,
    default_data_collator,
    set_seed,
)
from transformers.data.data_collator import pad_without_fast_tokenizer_warning

from bertkit.benchmarks.measure import (
    SteadyClock,
    device_name,
    steady_figures,
    steady_skip,
    synchronize,
)
from bertkit.data.atomic_files import write_json_atomic
from bertkit.errors import BertkitError
from bertkit.tasks.glue.family import FAMILY as GLUE
from bertkit.training.arguments import build_training_arguments, padding_multiple
from bertkit.training.length_grouped_trainer import LengthGroupedTrainer
from bertkit.training.models import count_parameters, load_tokenizer
from bertkit.training.run import hydra_run_dir
from bertkit.training.throughput import add_throughput

logger = logging.getLogger(__name__)

WAYS = ("plain", "bertkit")
DESCRIPTIONS = {
    "plain": "padding=max_length at tokenisation, random batches, Trainer + default_data_collator",
    "bertkit": "dynamic padding (DataCollatorWithPadding), batches by "
               "trainer.train_sampling_strategy={sampling} (LengthGroupedTrainer)",
}


def sampling(cfg, way: str) -> str:
    """The way's batch order: run_glue.py's random one, or bertkit's configured one."""
    return "random" if way == "plain" else str(cfg.trainer.train_sampling_strategy)


class PaddingCounter:
    """Wraps a collator and records, for every batch it builds, (rows, real tokens, positions).

    The training loop may build one batch ahead of the step it runs, so the batches fed to
    the first n steps are the first n recorded here.
    """

    def __init__(self, collate):
        self.collate = collate
        self.batches: list[tuple[int, int, int]] = []

    def __call__(self, features: list[dict]) -> dict:
        batch = self.collate(features)
        mask = batch["attention_mask"]
        self.batches.append((int(mask.shape[0]), int(mask.sum()), int(mask.numel())))
        return batch


def pad_to_max_length(
    train: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, max_length: int
) -> datasets.Dataset:
    """The features of tokenize_splits padded as tokenizer(..., padding="max_length") pads them."""
    columns = [name for name in tokenizer.model_input_names if name in train.column_names]

    def pad(batch: dict) -> dict:
        return dict(pad_without_fast_tokenizer_warning(
            tokenizer, {name: batch[name] for name in columns},
            padding="max_length", max_length=max_length))

    cached = [entry["filename"] for entry in train.cache_files]
    cache_file = None
    if cached:  # next to the cached tokenisation, so a repeated run reuses it
        source = Path(cached[0])
        cache_file = str(source.with_name(f"{source.stem}.padded-{max_length}.arrow"))
    return train.map(pad, batched=True, cache_file_name=cache_file,
                     keep_in_memory=cache_file is None, desc=f"Padding to {max_length}")


def _train(cfg: DictConfig, way: str, steps: int, run_dir: Path, build_model,
           train: datasets.Dataset, collate, tokenizer: PreTrainedTokenizerBase) -> dict:
    """One training run of `steps` optimizer steps from the seeded initial weights."""
    way_cfg = OmegaConf.merge(cfg, {"trainer": {"max_steps": steps,
                                                "train_sampling_strategy": sampling(cfg, way)}})
    args = build_training_arguments(way_cfg, run_dir, [])
    set_seed(args.seed)
    model = build_model()
    counter = PaddingCounter(collate)
    trainer_class = LengthGroupedTrainer if way == "bertkit" else Trainer
    trainer = trainer_class(model=model, args=args, train_dataset=train,
                            processing_class=tokenizer, data_collator=counter)
    trainer.remove_callback(PrinterCallback)  # its end-of-train line would only repeat ours
    meter = add_throughput(cfg, trainer)
    clock = SteadyClock(steady_skip(cfg.bench, steps), steps)
    trainer.add_callback(clock)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    synchronize()
    started = time.perf_counter()
    output = trainer.train()
    synchronize()
    seconds = time.perf_counter() - started
    if output.global_step != steps:
        raise BertkitError(f"bench: the {way} run made {output.global_step} steps, not {steps}")
    fed = counter.batches[:steps]
    result = {
        "seconds": seconds,
        **clock.figures(),
        "examples": sum(rows for rows, _, _ in fed),
        "real_tokens": sum(real for _, real, _ in fed),
        "positions": sum(positions for _, _, positions in fed),
        "training_loss": output.training_loss,
        "num_parameters": count_parameters(model),
        "throughput": meter.record if meter is not None else None,
    }
    del trainer, model
    gc.collect()
    return result


def _check(cfg: DictConfig) -> tuple[int, int, int]:
    """(steps, warmup_steps, repeats), or one message for a setting the comparison cannot use."""
    bench, task = cfg.bench, cfg.task
    steps, warmup_steps, repeats = int(bench.steps), int(bench.warmup_steps), int(bench.repeats)
    if steps < 1 or warmup_steps < 0 or repeats < 1:
        raise BertkitError(f"bench: steps ({steps}) and repeats ({repeats}) must be at least 1, "
                           f"warmup_steps ({warmup_steps}) at least 0")
    if bench.baseline_max_length < task.max_seq_length:
        raise BertkitError(
            f"bench.baseline_max_length={bench.baseline_max_length} is below "
            f"task.max_seq_length={task.max_seq_length}: both ways truncate at "
            f"task.max_seq_length, and the plain way pads every example to baseline_max_length")
    if cfg.trainer.gradient_accumulation_steps != 1:
        raise BertkitError("bench: trainer.gradient_accumulation_steps must be 1 (one batch a "
                           "step, so that samples/s is steps x batch / seconds)")
    return steps, warmup_steps, repeats


def _prepare(cfg: DictConfig):
    """The GLUE family's own data and model steps, exactly as `recipe=glue` runs them:
    (tokenizer, tokenised train split, a function building the seeded model)."""
    GLUE.generate_data(cfg)
    splits = GLUE.read(cfg)
    tokenizer = load_tokenizer(cfg.model)
    data = GLUE.featurize(cfg, splits, tokenizer)
    return tokenizer, data.features["train"], lambda: GLUE.build_model(cfg, tokenizer, data)


def _way_summary(cfg, way: str, runs: list[dict]) -> dict:
    """One way's throughput: the median time over repeats; counts from the first run (every
    repeat feeds the same batches)."""
    first = runs[0]
    seconds = statistics.median(run["seconds"] for run in runs)
    meter = first["throughput"] or {}
    peak = meter.get("peak_tflops")
    flops = meter.get("flops")
    gpu = torch.cuda.is_available()
    return {
        "description": DESCRIPTIONS[way].format(sampling=sampling(cfg, way)),
        "train_sampling_strategy": sampling(cfg, way),
        "samples_per_second": first["examples"] / seconds,
        # Samples/s only: the widths of bertkit's batches vary, so FLOPs are not in proportion.
        "steady_samples_per_second": steady_figures(runs, first["examples"], None,
                                                    None)["steady_samples_per_second"],
        "seconds": seconds,
        "seconds_each_repeat": [run["seconds"] for run in runs],
        "examples": first["examples"],
        "real_tokens": first["real_tokens"],
        "positions": first["positions"],
        "padding_share": 1 - first["real_tokens"] / first["positions"],
        "mean_padded_length": first["positions"] / first["examples"],
        "mean_length": first["real_tokens"] / first["examples"],
        "training_loss": first["training_loss"],
        "real_tokens_per_second": first["real_tokens"] / seconds,
        "flops": flops,
        "mfu": flops / (seconds * peak * 1e12) if flops and peak else None,
        "peak_memory_gb": max(run["throughput"]["peak_memory_gb"] for run in runs)
        if gpu and meter else None,
    }


def _result(cfg: DictConfig, probe, precision: str, ways: dict, runs: dict,
            train_examples: int, schedule: tuple[int, int, int]) -> dict:
    """bench.json: the settings both ways ran with, each way's figures and their ratio;
    schedule: (steps, warmup_steps, repeats) as _check read them."""
    bench, task = cfg.bench, cfg.task
    steps, warmup_steps, repeats = schedule
    ratio = ways["bertkit"]["samples_per_second"] / ways["plain"]["samples_per_second"]
    steady = [ways[way]["steady_samples_per_second"] for way in ("bertkit", "plain")]
    model = cfg.model.config
    return {
        "recipe": cfg.recipe.name,
        "task": task.name,
        "train_examples": train_examples,
        "model": {"name_or_path": cfg.model.name_or_path or "from_scratch",
                  "num_hidden_layers": model.num_hidden_layers,
                  "hidden_size": model.hidden_size,
                  "num_parameters": runs["plain"][0]["num_parameters"]},
        "device": device_name(),
        "torch_threads": torch.get_num_threads(),
        "precision": precision,
        "steps": steps,
        "warmup_steps": warmup_steps,
        "repeats": repeats,
        "batch_size": probe.per_device_train_batch_size,
        "learning_rate": probe.learning_rate,
        "seed": probe.seed,
        "max_seq_length": task.max_seq_length,
        "baseline_max_length": int(bench.baseline_max_length),
        "pad_to_multiple_of": padding_multiple(cfg, precision != "fp32"),
        "timing": "wall time of trainer.train() per timed run, median over repeats; each way "
                  "first ran warmup_steps steps on a throwaway copy (not timed)",
        "steady_skip": steady_skip(bench, steps),
        "ways": ways,
        "ratio": ratio,
        "steady_ratio": steady[0] / steady[1] if all(steady) else None,
    }


def benchmark_glue_padding(cfg: DictConfig, run_dir: Path | None = None) -> dict:
    run_dir = Path(run_dir or hydra_run_dir())
    bench = cfg.bench
    steps, warmup_steps, repeats = _check(cfg)
    if bench.num_threads is not None:
        torch.set_num_threads(int(bench.num_threads))

    tokenizer, train_split, build_model = _prepare(cfg)
    train = {"plain": pad_to_max_length(train_split, tokenizer, int(bench.baseline_max_length)),
             "bertkit": train_split}

    def collator(way: str, precision: str):
        if way == "plain":
            return default_data_collator
        multiple = padding_multiple(cfg, precision != "fp32")
        return DataCollatorWithPadding(tokenizer, pad_to_multiple_of=multiple)

    # The precision every run below resolves (it decides pad_to_multiple_of).
    probe = build_training_arguments(cfg, run_dir, [])
    precision = "bf16" if probe.bf16 else "fp16" if probe.fp16 else "fp32"
    if probe.world_size > 1:
        raise BertkitError("bench: run on one process (it compares single-process throughput)")
    scratch = run_dir / "checkpoints"

    train_way = functools.partial(_train, cfg, run_dir=run_dir, build_model=build_model,
                                  tokenizer=tokenizer)
    if warmup_steps:
        for way in WAYS:
            logger.info("bench %s: warm-up, %d steps (not timed)", way, warmup_steps)
            train_way(way, warmup_steps, train=train[way], collate=collator(way, precision))
    runs: dict[str, list[dict]] = {way: [] for way in WAYS}
    for repeat in range(repeats):  # alternating order: plain, bertkit, bertkit, plain, ...
        for way in WAYS if repeat % 2 == 0 else WAYS[::-1]:
            logger.info("bench %s: timed run %d of %d, %d steps", way, repeat + 1, repeats, steps)
            runs[way].append(train_way(way, steps, train=train[way],
                                       collate=collator(way, precision)))
    if scratch.is_dir() and not any(scratch.iterdir()):
        scratch.rmdir()

    ways = {way: _way_summary(cfg, way, runs[way]) for way in WAYS}
    result = _result(cfg, probe, precision, ways, runs, len(train_split),
                     (steps, warmup_steps, repeats))
    path = write_json_atomic(run_dir / "bench.json", result)
    print(_table(result, path))
    return result


def _table(result: dict, path: Path) -> str:
    model = result["model"]
    lines = [
        f"\nbench_glue {result['task']}: {result['steps']} steps x batch {result['batch_size']} "
        f"({result['warmup_steps']} warm-up steps not timed, {result['repeats']} repeat(s)), "
        f"{model['num_hidden_layers']}x{model['hidden_size']} BERT, {result['device']} "
        f"{result['precision']}, {result['torch_threads']} threads",
        f"  {'way':<8} {'samples/s':>10} {'tokens/s':>10} {'seconds':>9} {'padding':>8} "
        f"{'positions/example':>18} {'MFU':>6} {'memory':>8}",
    ]
    for way, values in result["ways"].items():
        mfu = f"{values['mfu']:.1%}" if values["mfu"] is not None else "n/a"
        memory = (f"{values['peak_memory_gb']:.1f} GiB" if values["peak_memory_gb"] is not None
                  else "n/a")
        lines.append(f"  {way:<8} {values['samples_per_second']:>10.1f} "
                     f"{values['real_tokens_per_second']:>10.0f} "
                     f"{values['seconds']:>9.2f} {values['padding_share']:>8.1%} "
                     f"{values['mean_padded_length']:>18.1f} {mfu:>6} {memory:>8}")
    lines.append(f"  ratio bertkit/plain: {result['ratio']:.2f}x")
    if result["steady_ratio"] is not None:
        steady = {way: values["steady_samples_per_second"]
                  for way, values in result["ways"].items()}
        lines.append(f"  after the first {result['steady_skip']} steps: plain "
                     f"{steady['plain']:.1f}, bertkit {steady['bertkit']:.1f} samples/s, "
                     f"ratio {result['steady_ratio']:.2f}x")
    lines.append(f"  result: {path}")
    return "\n".join(lines)
