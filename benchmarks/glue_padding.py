"""The bench_glue job: training throughput of one GLUE task padded two ways, `plain` (run_glue.py's
default: padded to a fixed length at tokenisation, random batches, default_data_collator) and
`bertkit` (per-batch padding, recipe=glue's batch order), from the same weights, examples and
steps. docs/speed.md ("How bench-glue compares") says what is held equal and what the
figures mean. Writes bench.json and prints a table."""

from __future__ import annotations

import dataclasses
import functools
import logging
from pathlib import Path

import datasets
import torch
from omegaconf import DictConfig, OmegaConf
from transformers import (
    DataCollatorWithPadding,
    PreTrainedTokenizerBase,
    Trainer,
    default_data_collator,
    set_seed,
)
from transformers.data.data_collator import pad_without_fast_tokenizer_warning

from benchmarks.command import main
from benchmarks.measure import (
    device_name,
    median_seconds,
    ratio,
    steady_figures,
    steady_skip,
    utilisation,
)
from benchmarks.report import optional, publish
from benchmarks.settings import check_settings
from benchmarks.side_by_side import (
    Schedule,
    check_steps,
    one_batch_a_step,
    one_process,
    release,
    remove_if_empty,
    run_ways,
    train_timed,
)
from bertkit.errors import BertkitError
from bertkit.jobs import Job
from bertkit.tasks.glue.family import FAMILY as GLUE
from bertkit.training.models import count_parameters, load_tokenizer
from bertkit.training.run import build_training_arguments, hydra_run_dir
from bertkit.training.trainer import (
    BertkitTrainer,
    padding_multiple,
    static_shapes_pay,
    use_padded_rows,
)

RESULT_FILE = "bench.json"  # written last (JOB names it)

logger = logging.getLogger(__name__)

WAYS = ("plain", "bertkit")
DESCRIPTIONS = {
    "plain": "padding=max_length at tokenisation, random batches, Trainer + default_data_collator",
    "bertkit": "dynamic padding (DataCollatorWithPadding), batches by "
               "trainer.train_sampling_strategy={sampling} (BertkitTrainer)",
}


def sampling(trainer: DictConfig, way: str) -> str:
    """The way's batch order: run_glue.py's random one, or bertkit's configured one."""
    return "random" if way == "plain" else str(trainer.train_sampling_strategy)


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


@dataclasses.dataclass(frozen=True)
class PaddingJob:
    """What the benchmark's steps read of its config, taken once at its entry (padding_job)."""

    arguments: DictConfig  # the config TrainingArguments are built from
    compile: DictConfig  # the config static shapes are decided from
    trainer: DictConfig
    task: DictConfig
    model: DictConfig
    bench: DictConfig
    throughput: DictConfig | None
    recipe: str


def padding_job(cfg: DictConfig) -> PaddingJob:
    """The benchmark's PaddingJob, from its config."""
    return PaddingJob(cfg, cfg, cfg.trainer, cfg.task,
                      cfg.model, cfg.bench, OmegaConf.select(cfg, "throughput"), cfg.recipe.name)


def build_trainer(job: PaddingJob, way: str, steps: int, run_dir: Path, build_model,
                  train: datasets.Dataset, collate, tokenizer: PreTrainedTokenizerBase):
    """The way's Trainer for `steps` optimizer steps from the seeded initial weights, its
    model, and the PaddingCounter around its collator (cards/gpu/profile_step.py
    profiles the same trainer)."""
    order = sampling(job.trainer, way)
    args = build_training_arguments(
        job.arguments, run_dir, [], {"max_steps": steps, "train_sampling_strategy": order})
    set_seed(args.seed)
    model = build_model()
    counter = PaddingCounter(collate)
    trainer_class = BertkitTrainer if way == "bertkit" else Trainer
    trainer = trainer_class(model=model, args=args, train_dataset=train,
                            processing_class=tokenizer, data_collator=counter)
    # bertkit's full rows, as a finetune
    if way == "bertkit" and static_shapes_pay(job.compile):
        use_padded_rows(trainer, GLUE.padded_rows(job.task))
    return trainer, model, counter


def collator(job: PaddingJob, tokenizer: PreTrainedTokenizerBase, way: str, precision: str):
    """run_glue.py's collator for the pre-padded plain way; bertkit's per-batch padding."""
    if way == "plain":
        return default_data_collator
    multiple = padding_multiple(job.compile, precision != "fp32")
    return DataCollatorWithPadding(tokenizer, pad_to_multiple_of=multiple)


def _train(job: PaddingJob, way: str, steps: int, run_dir: Path, build_model,
           train: datasets.Dataset, collate, tokenizer: PreTrainedTokenizerBase) -> dict:
    """One training run of `steps` optimizer steps from the seeded initial weights."""
    trainer, model, counter = build_trainer(job, way, steps, run_dir, build_model, train,
                                            collate, tokenizer)
    run = train_timed(job.bench, job.throughput, trainer, steps)
    check_steps(way, run.output.global_step, steps)
    fed = counter.batches[:steps]
    result = {
        "seconds": run.seconds,
        **run.steady,
        "examples": sum(rows for rows, _, _ in fed),
        "real_tokens": sum(real for _, real, _ in fed),
        "positions": sum(positions for _, _, positions in fed),
        "training_loss": run.output.training_loss,
        "num_parameters": count_parameters(model),
        "throughput": run.meter,
    }
    del trainer, model
    release(empty_cache=False)
    return result


def _check(bench: DictConfig, task: DictConfig, trainer: DictConfig) -> Schedule:
    """The schedule, or one message for a setting the comparison cannot use."""
    schedule = Schedule.read(bench)
    if bench.baseline_max_length < task.max_seq_length:
        raise BertkitError(
            f"bench.baseline_max_length={bench.baseline_max_length} is below "
            f"task.max_seq_length={task.max_seq_length}: both ways truncate at "
            f"task.max_seq_length, and the plain way pads every example to baseline_max_length")
    one_batch_a_step(trainer, "so that samples/s is steps x batch / seconds")
    return schedule


def prepare(task: DictConfig, model: DictConfig, data_source: str, cache_dir: str | None,
            num_proc: int | None):
    """The GLUE family's own data and model steps, exactly as `recipe=glue` runs them:
    (tokenizer, tokenised train split, a function building the seeded model)."""
    GLUE.generate_data(task)
    splits = GLUE.read(task, data_source)
    tokenizer = load_tokenizer(model)
    data = GLUE.featurize(task, splits, tokenizer, cache_dir, num_proc)
    return (tokenizer, data.features["train"],
            lambda: GLUE.build_model(task, model, tokenizer, data))


def _way_summary(trainer: DictConfig, way: str, runs: list[dict]) -> dict:
    """One way's throughput: the median time over repeats; counts from the first run (every
    repeat feeds the same batches)."""
    first = runs[0]
    timing = median_seconds([run["seconds"] for run in runs])
    seconds = timing["seconds"]
    meter = first["throughput"] or {}
    peak = meter.get("peak_tflops")
    flops = meter.get("flops")
    gpu = torch.cuda.is_available()
    return {
        "description": DESCRIPTIONS[way].format(sampling=sampling(trainer, way)),
        "train_sampling_strategy": sampling(trainer, way),
        "samples_per_second": first["examples"] / seconds,
        # Samples/s only: the widths of bertkit's batches vary, so FLOPs are not in proportion.
        "steady_samples_per_second": steady_figures(runs, first["examples"], None,
                                                    None)["steady_samples_per_second"],
        **timing,
        "examples": first["examples"],
        "real_tokens": first["real_tokens"],
        "positions": first["positions"],
        "padding_share": 1 - first["real_tokens"] / first["positions"],
        "mean_padded_length": first["positions"] / first["examples"],
        "mean_length": first["real_tokens"] / first["examples"],
        "training_loss": first["training_loss"],
        "real_tokens_per_second": first["real_tokens"] / seconds,
        "flops": flops,
        "mfu": utilisation(flops, seconds, peak and peak * 1e12),
        "peak_memory_gb": max(run["throughput"]["peak_memory_gb"] for run in runs)
        if gpu and meter else None,
    }


def _result(job: PaddingJob, probe, precision: str, ways: dict, runs: dict,
            train_examples: int, schedule: Schedule) -> dict:
    """bench.json: the settings both ways ran with, each way's figures and their ratio."""
    bench, task = job.bench, job.task
    bertkit, plain = ways["bertkit"], ways["plain"]
    model = job.model.config
    return {
        "recipe": job.recipe,
        "task": task.name,
        "train_examples": train_examples,
        "model": {"name_or_path": job.model.name_or_path or "from_scratch",
                  "num_hidden_layers": model.num_hidden_layers,
                  "hidden_size": model.hidden_size,
                  "num_parameters": runs["plain"][0]["num_parameters"]},
        "device": device_name(),
        "torch_threads": torch.get_num_threads(),
        "precision": precision,
        **schedule.fields(),
        "batch_size": probe.per_device_train_batch_size,
        "learning_rate": probe.learning_rate,
        "seed": probe.seed,
        "max_seq_length": task.max_seq_length,
        "baseline_max_length": int(bench.baseline_max_length),
        "pad_to_multiple_of": padding_multiple(job.compile, precision != "fp32"),
        "timing": "wall time of trainer.train() per timed run, median over repeats; each way "
                  "first ran warmup_steps steps on a throwaway copy (not timed)",
        "steady_skip": steady_skip(bench, schedule.steps),
        "ways": ways,
        "ratio": ratio(bertkit["samples_per_second"], plain["samples_per_second"]),
        "steady_ratio": ratio(bertkit["steady_samples_per_second"],
                              plain["steady_samples_per_second"]),
    }


def benchmark_glue_padding(cfg: DictConfig, run_dir: Path | None = None) -> dict:
    check_settings(cfg)
    run_dir = Path(run_dir or hydra_run_dir())
    bench = cfg.bench
    schedule = _check(bench, cfg.task, cfg.trainer)
    tokenizer, train_split, build_model = prepare(cfg.task, cfg.model, cfg.data_source,
                                                  cfg.cache_dir, cfg.preprocessing_num_workers)
    train = {"plain": pad_to_max_length(train_split, tokenizer, int(bench.baseline_max_length)),
             "bertkit": train_split}

    # The precision every run below resolves (it decides pad_to_multiple_of).
    job = padding_job(cfg)
    probe = build_training_arguments(job.arguments, run_dir, [])
    precision = "bf16" if probe.bf16 else "fp16" if probe.fp16 else "fp32"
    one_process(cfg.bench, probe, "it compares single-process throughput")

    train_way = functools.partial(_train, job, run_dir=run_dir, build_model=build_model,
                                  tokenizer=tokenizer)
    runs = run_ways(WAYS, schedule, lambda way, steps, timed: train_way(
        way, steps, train=train[way], collate=collator(job, tokenizer, way, precision)))
    remove_if_empty(run_dir / "checkpoints")

    ways = {way: _way_summary(cfg.trainer, way, runs[way]) for way in WAYS}
    result = _result(job, probe, precision, ways, runs, len(train_split), schedule)
    publish(result, run_dir / RESULT_FILE, _table)
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
        mfu = optional(values["mfu"], ".1%")
        memory = optional(values["peak_memory_gb"], ".1f")
        memory = memory if values["peak_memory_gb"] is None else f"{memory} GiB"
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


# What `python -m benchmarks.glue_padding` runs: its job on its primary config,
# benchmarks/conf/bench_glue.yaml.
CONFIG = "bench_glue"
JOB = Job("benchmarks.glue_padding:benchmark_glue_padding", RESULT_FILE)

if __name__ == "__main__":
    main(JOB, CONFIG)
