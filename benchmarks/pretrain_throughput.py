"""The bench_pretrain job: pretraining throughput of the plain Hugging Face way
(BertForPreTraining, padded to max_seq_length, random batches, DataCollatorForLanguageModeling)
and of bertkit's (the MLM head on masked positions, dynamic masking per batch, batches at the
phase length or padding-free), from the same initial weights, instances, steps and
precision, alternating in one process. docs/speed.md ("How bench-pretrain compares") says
what is held equal, what is timed and how MFU is counted. Writes bench_pretrain.json and
prints a markdown table.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import statistics
from pathlib import Path

import datasets
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf, open_dict
from torch.nn import functional
from transformers import (
    BertConfig,
    BertForPreTraining,
    DataCollatorForLanguageModeling,
    PreTrainedTokenizerBase,
    Trainer,
    set_seed,
)

from benchmarks.command import main
from benchmarks.glue_padding import pad_to_max_length
from benchmarks.measure import (
    BatchCounter,
    PeakMemory,
    device_name,
    median_seconds,
    ratio,
    steady_figures,
    steady_skip,
    utilisation,
)
from benchmarks.report import markdown_head, optional, publish
from benchmarks.settings import check_setting, check_settings
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
from bertkit.pretraining.batches import PackingPlan, Phase, per_position_labels
from bertkit.pretraining.masking import IGNORE_INDEX, masking_rule_from_config, most_predictions
from bertkit.pretraining.model import load_pretraining_model
from bertkit.pretraining.run import (
    build_pretraining_trainer,
    check_pretraining_config,
    is_streaming,
    prepare_pretraining_data,
)
from bertkit.training.models import count_parameters, dropout_settings
from bertkit.training.run import build_training_arguments, hydra_run_dir
from bertkit.training.throughput import peak_flops, precision_of, training_flops

logger = logging.getLogger(__name__)

RESULT_FILE = "bench_pretrain.json"
WAYS = ("plain", "bertkit")
DESCRIPTIONS = {
    "plain": "BertForPreTraining (vocabulary head on every position), padded to max_seq_length, "
             "random batches, DataCollatorForLanguageModeling, Trainer",
    "bertkit": "MaskedOnlyBertForPreTraining (head on masked positions), dynamic masking with "
               "batches padded to the phase length with fixed masked slots (one shape "
               "per phase; grouped by length on an eager CPU, a plain shuffle otherwise), or "
               "padding-free with pretraining.padding_free, PretrainingTrainer",
}


class PlainBertForPreTraining(BertForPreTraining):
    """BertForPreTraining, with the MLM loss alone when there is no sentence label (objective=
    mlm), where transformers returns no loss at all."""

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None,
                next_sentence_label=None, **kwargs):
        output = super().forward(input_ids, attention_mask=attention_mask,
                                 token_type_ids=token_type_ids, labels=labels,
                                 next_sentence_label=next_sentence_label, **kwargs)
        if output.loss is None and labels is not None:
            logits = output.prediction_logits
            output.loss = functional.cross_entropy(logits.view(-1, logits.shape[-1]),
                                                   labels.view(-1))
        return output


def training_indices(n: int, count: int, seed: int) -> list[int]:
    """count indices into n instances: a seeded permutation, cycled. Every instance appears
    count // n or count // n + 1 times."""
    order = np.random.default_rng(seed).permutation(n)
    return order[np.arange(count) % n].tolist()


def plain_model(model: DictConfig, tokenizer: PreTrainedTokenizerBase, initial: dict):
    """The plain model: transformers' defaults (attention included), bertkit's initial weights."""
    config = BertConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                        **OmegaConf.to_container(model.config),
                        **dropout_settings(model))
    plain = PlainBertForPreTraining(config)
    plain.load_state_dict(initial)
    return plain


@dataclasses.dataclass
class _Data:
    """The pipeline's output, and the plain way's copy of the instances padded to length."""

    prepared: object  # prepare_pretraining_data's result
    padded: datasets.Dataset
    eval_batches: list[dict]


def _check(cfg: DictConfig) -> Schedule:
    schedule = Schedule.read(cfg.bench)
    check_setting("bench.eval_instances", cfg.bench.eval_instances)  # the schema's, first
    if cfg.masking.kind != "dynamic":
        raise BertkitError("bench_pretrain compares dynamic masking (the plain way masks in "
                           "DataCollatorForLanguageModeling); use masking=dynamic")
    if cfg.pretraining.long_phase.fraction != 0:
        raise BertkitError("bench_pretrain times one sequence length: set "
                           "pretraining.long_phase.fraction=0")
    if is_streaming(cfg.corpus):
        raise BertkitError("bench_pretrain needs the instances stored (the plain way pads them "
                           "all); set corpus.hub.streaming=false")
    one_batch_a_step(cfg.trainer, "so that samples/s is steps x batch / seconds")
    # cfg with the bench's max_steps (TrainingArguments names the trainer group may lack)
    checked = cfg.copy()
    with open_dict(checked):
        checked.trainer = OmegaConf.merge(checked.trainer, {"max_steps": schedule.steps})
    check_pretraining_config(checked)
    return schedule


@dataclasses.dataclass(frozen=True)
class _Job:
    """What the benchmark's steps read of its config, taken once at its entry."""

    arguments: DictConfig  # the config TrainingArguments are built from
    data: DictConfig  # the pretraining pipeline's nodes (corpus, model, masking, ...)
    bench: DictConfig
    throughput: DictConfig | None
    recipe: str
    pad_to_multiple_of: int | None


def throughput_job(cfg: DictConfig) -> _Job:
    """The benchmark's _Job, from its config."""
    return _Job(cfg, cfg, cfg.bench,
                OmegaConf.select(cfg, "throughput"), cfg.recipe.name, cfg.pad_to_multiple_of)


def _arguments(job: _Job, way: str, steps: int, run_dir: Path):
    options = {"max_steps": steps}
    if way == "plain":
        options.update(OmegaConf.to_container(job.bench.plain_trainer, resolve=True))
    return build_training_arguments(job.arguments, run_dir, [], options)


def _prepare(job: _Job, run_dir: Path, steps: int) -> _Data:
    """The instances by recipe=pretrain's own pipeline; the plain way's padded copy; the masked
    instances the MLM loss is measured on (bertkit's rule, seeded: the same for both ways)."""
    args = _arguments(job, "bertkit", steps, run_dir)
    set_seed(args.seed)
    prepared = prepare_pretraining_data(job.data, args)
    instances = prepared.train_dataset
    length = int(job.data.pretraining.max_seq_length)
    padded = pad_to_max_length(instances, prepared.tokenizer, length)
    columns = [name for name in instances.column_names if name != "length"]
    evaluated = instances.select(range(min(len(instances), int(job.bench.eval_instances))))
    rows = evaluated.select_columns(columns).to_list()
    batch = int(job.bench.batch_size)
    torch.manual_seed(args.seed)  # the collator masks from torch's RNG
    # Padded, for both ways (the plain model takes no padding-free batch).
    padded_collator = copy.copy(prepared.collator)
    padded_collator.packed = None
    eval_batches = [padded_collator(rows[start:start + batch])
                    for start in range(0, len(rows), batch)]
    return _Data(prepared, padded, eval_batches)


def masked_lm_loss(model, batches: list[dict]) -> float:
    """Mean MLM loss over every masked token of the batches, the head run on the masked
    positions (the same for both model classes: they share BertForPreTraining's modules)."""
    model.eval()
    device = next(model.parameters()).device
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in batches:
            batch = {name: value.to(device) for name, value in batch.items()}
            hidden = model.bert(batch["input_ids"], attention_mask=batch.get("attention_mask"),
                                token_type_ids=batch.get("token_type_ids"), return_dict=False)[0]
            labels = batch["labels"] if "labels" in batch else per_position_labels(batch)
            masked = labels != IGNORE_INDEX
            head = getattr(model, "vocabulary_logits", None)  # bertkit's: without padding rows
            logits = head(hidden[masked]) if head else model.cls.predictions(hidden[masked]).float()
            total += float(functional.cross_entropy(logits, labels[masked], reduction="sum"))
            count += int(masked.sum())
    return total / max(count, 1)


def _trainer(job: _Job, way: str, args, data: _Data, indices: list[int], collate):
    """(Trainer, model) of one way, from the seeded initial weights."""
    prepared = data.prepared
    set_seed(args.seed)
    if way == "bertkit":
        instances = prepared.train_dataset.select(indices)
        lengths = np.asarray(instances["length"])
        packing = prepared.packing  # padding-free: the subset's instances' masked counts
        if packing is not None:
            packing = PackingPlan(packing.shapes[:1], [
                most_predictions(lengths, masking_rule_from_config(job.data.masking))])
        subset = dataclasses.replace(prepared, train_dataset=instances, collator=collate,
                                     phases=[Phase(0, lengths, len(indices))], packing=packing)
        trainer, _ = build_pretraining_trainer(job.data, args, subset)
        return trainer, trainer.model
    # bertkit's initial weights, unpadded (the plain way's vocabulary is the tokenizer's):
    # pad_vocabulary leaves the real rows as they are, so both ways start alike.
    initial = load_pretraining_model(job.data.model, prepared.tokenizer).state_dict()
    model = plain_model(job.data.model, prepared.tokenizer, initial)
    trainer = Trainer(model=model, args=args, train_dataset=data.padded.select(indices),
                      data_collator=collate, processing_class=prepared.tokenizer)
    return trainer, model


def _train(job: _Job, way: str, steps: int, data: _Data, run_dir: Path,
           timed: bool = True) -> dict:
    """One run of `steps` optimizer steps from the seeded initial weights."""
    args = _arguments(job, way, steps, run_dir)
    indices = training_indices(len(data.prepared.train_dataset),
                               steps * args.per_device_train_batch_size, args.seed)
    prepared = data.prepared
    collate = prepared.collator if way == "bertkit" else DataCollatorForLanguageModeling(
        prepared.tokenizer, mlm_probability=float(job.bench.mlm_probability))
    trainer, model = _trainer(job, way, args, data, indices, collate)
    counter = BatchCounter()
    counter.attach(model)
    with PeakMemory() as memory:
        run = train_timed(job.bench, job.throughput, trainer, steps)
    check_steps(way, run.output.global_step, steps, forwards=len(counter.shapes))
    result = {"seconds": run.seconds, **run.steady, **counter.totals(),
              "peak_memory_bytes": memory.peak,
              "memory_kind": memory.kind, "training_loss": run.output.training_loss,
              "num_parameters": count_parameters(model),
              "attn_implementation": model.config._attn_implementation,
              "config": model.config, "vocab_rows": getattr(model, "vocab_rows", None),
              "meter": run.meter}
    if timed:
        result["mlm_loss"] = masked_lm_loss(model, data.eval_batches)
    del trainer, model
    release()
    return result


def _flops(way: str, config, counts: dict) -> tuple[float, float]:
    """(useful FLOPs: what the model's design computes on the real tokens; hardware FLOPs: on
    every position fed, padding included). The vocabulary head runs where the model runs it:
    bertkit's on the masked positions, the plain one on every real position (useful) and on
    every position fed, padding too (hardware)."""
    masked = counts["masked_tokens"]
    # Useful: the vocabulary the model predicts; hardware: the rows the head multiplies,
    # bertkit's padded to pretraining.pad_vocab_to_multiple_of included.
    padded = config
    config = BertConfig(**{**config.to_dict(), "vocab_size": counts["vocab_rows"]}) \
        if counts.get("vocab_rows") else config
    useful_head = masked if way == "bertkit" else counts["real_tokens"]
    # bertkit's head runs on its fixed slots (unused ones too); the plain way's on every position.
    hardware_head = counts["mlm_slots"] if way == "bertkit" else counts["positions"]
    useful = training_flops(config, real_tokens=counts["real_tokens"],
                            sum_squared_lengths=counts["sum_squared_lengths"],
                            predicted_tokens=useful_head, sequences=counts["sequences"])
    hardware = training_flops(padded, real_tokens=counts["positions"],
                              sum_squared_lengths=counts["sum_squared_widths"],
                              predicted_tokens=hardware_head, sequences=counts["sequences"])
    return useful, hardware


def _way_summary(way: str, runs: list[dict], peak: float | None) -> dict:
    """One way's figures: the median time over repeats; counts from the first run (every
    repeat feeds the same batches)."""
    first = runs[0]
    timing = median_seconds([run["seconds"] for run in runs])
    seconds = timing["seconds"]
    useful, hardware = _flops(way, first["config"], first)
    counts = {key: first[key] for key in ("sequences", "real_tokens", "positions",
                                          "sum_squared_lengths", "sum_squared_widths",
                                          "masked_tokens")}
    steady = steady_figures(runs, first["sequences"], useful, peak)
    return {
        "description": DESCRIPTIONS[way],
        **steady,
        "samples_per_second": first["sequences"] / seconds,
        "real_tokens_per_second": first["real_tokens"] / seconds,
        **timing,
        **counts,
        "real_token_share": first["real_tokens"] / first["positions"],
        "peak_memory_bytes": max(run["peak_memory_bytes"] for run in runs),
        "peak_memory_kind": first["memory_kind"],
        "mlm_loss": statistics.median(run["mlm_loss"] for run in runs),
        "training_loss": first["training_loss"],
        "attn_implementation": first["attn_implementation"],
        "meter": first["meter"],
        "flops": useful,
        "hardware_flops": hardware,
        "mfu": utilisation(useful, seconds, peak),
        "hfu": utilisation(hardware, seconds, peak),
    }


def _peak(table: DictConfig | None, name: str, precision: str) -> float | None:
    """The device's peak FLOP/s at this precision (table: throughput.peak_tflops); none on a
    CPU."""
    if name == "cpu":
        return None
    return peak_flops(name, precision, OmegaConf.to_container(table) if table else {})


def benchmark_pretrain_throughput(cfg: DictConfig, run_dir: Path | None = None) -> dict:
    check_settings(cfg)
    run_dir = Path(run_dir or hydra_run_dir())
    schedule = _check(cfg)
    job = throughput_job(cfg)
    probe = _arguments(job, "bertkit", schedule.steps, run_dir)
    one_process(cfg.bench, probe, "it compares single-process throughput")
    data = _prepare(job, run_dir, schedule.steps)

    runs = run_ways(WAYS, schedule, lambda way, steps, timed: _train(
        job, way, steps, data, run_dir, timed=timed))
    remove_if_empty(run_dir / "checkpoints")

    name, precision = device_name(), precision_of(probe)
    peak = _peak(OmegaConf.select(cfg, "throughput.peak_tflops", default=None), name, precision)
    ways = {way: _way_summary(way, runs[way], peak) for way in WAYS}
    result = _result(job, probe, data, ways, runs, schedule)
    result.update(device_name=name, precision=precision, peak_flops=peak)
    publish(result, run_dir / RESULT_FILE, table)
    return result


def _result(job: _Job, probe, data: _Data, ways: dict, runs: dict,
            schedule: Schedule) -> dict:
    config = runs["plain"][0]["config"]
    masking = job.data.masking
    return {
        "recipe": job.recipe,
        "corpus": job.data.corpus.name,
        "objective": job.data.objective.name,
        "instances": len(data.prepared.train_dataset),
        "instance_tokens": int(np.sum(data.prepared.train_dataset["length"])),
        "model": {"num_hidden_layers": config.num_hidden_layers,
                  "hidden_size": config.hidden_size, "vocab_size": config.vocab_size,
                  "num_parameters": runs["plain"][0]["num_parameters"]},
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "torch_threads": torch.get_num_threads(),
        **schedule.fields(),
        "batch_size": probe.per_device_train_batch_size,
        "learning_rate": probe.learning_rate,
        "optim": str(probe.optim),
        "seed": probe.seed,
        "max_seq_length": int(job.data.pretraining.max_seq_length),
        "masking": {"plain_mlm_probability": float(job.bench.mlm_probability),
                    "bertkit_mlm_probability": masking.mlm_probability,
                    "bertkit_max_predictions_per_seq": masking.max_predictions_per_seq},
        "pad_to_multiple_of": job.pad_to_multiple_of if (probe.bf16 or probe.fp16) else None,
        "padding_free": data.prepared.packing is not None,
        "timing": "wall time of trainer.train() per timed run (CUDA synchronised), median over "
                  "repeats in alternating order; each way first ran warmup_steps steps on a "
                  "throwaway model (not timed)",
        "mlm_loss": f"each trained model on the first {len(data.eval_batches)} batch(es) of "
                    f"the instances, masked once by bertkit's rule (seeded), median over repeats",
        "flops": "fwd+bwd matmuls (bertkit.training.throughput); useful: the encoder on the real "
                 "tokens, hardware: on every position fed; the head on the masked positions "
                 "(bertkit) or on every position fed (plain)",
        "ways": ways,
        "steady_skip": steady_skip(job.bench, schedule.steps),
        "steady": "steady_*: the steps after the first steady_skip of each timed run (CUDA "
                  "synchronised at both ends), median over repeats; FLOPs and samples counted "
                  "in proportion (every step feeds one batch of the same width)",
        "ratio": {key: ratio(ways["bertkit"][key], ways["plain"][key])
                  for key in ("samples_per_second", "real_tokens_per_second",
                              "steady_samples_per_second") if ways["plain"].get(key)},
    }


def _memory(value: int) -> str:
    return f"{value / 2**30:.2f} GiB"


def table(result: dict, path: Path | None = None) -> str:
    """The markdown table of both ways and the ratio."""
    model, ways = result["model"], result["ways"]
    gpu = result["peak_flops"] is not None
    lines = [
        f"\nbench_pretrain {result['corpus']} ({result['objective']}, {result['instances']:,} "
        f"instances): {result['steps']} steps x batch {result['batch_size']}, "
        f"{result['warmup_steps']} warm-up steps not timed, {result['repeats']} repeat(s); "
        f"{model['num_hidden_layers']}x{model['hidden_size']} BERT "
        f"({model['num_parameters'] / 1e6:.1f}M parameters, vocab {model['vocab_size']:,}), "
        f"{result['device_name']} {result['precision']}, {result['torch_threads']} threads\n",
        *markdown_head("way", "samples/s", "real tokens/s", "seconds", "real-token share",
                       "peak memory", "MLM loss", "MFU", "HFU", "steady samples/s",
                       "steady MFU"),
    ]
    for way, values in ways.items():
        mfu = f"{values['mfu']:.1%}" if gpu else "n/a"
        hfu = f"{values['hfu']:.1%}" if gpu else "n/a"
        lines.append(f"| {way} | {values['samples_per_second']:.1f} "
                     f"| {values['real_tokens_per_second']:,.0f} | {values['seconds']:.2f} "
                     f"| {values['real_token_share']:.1%} "
                     f"| {_memory(values['peak_memory_bytes'])} | {values['mlm_loss']:.3f} "
                     f"| {mfu} | {hfu} | {optional(values['steady_samples_per_second'], '.1f')} "
                     f"| {optional(values['steady_mfu'], '.1%')} |")
    ratio = result["ratio"]
    lines.append(f"| bertkit/plain | **{ratio['samples_per_second']:.2f}x** "
                 f"| **{ratio['real_tokens_per_second']:.2f}x** | | | | | | "
                 f"| {optional(ratio.get('steady_samples_per_second'), '.2f')}x | |")
    lines.append(f"\npeak memory: {ways['plain']['peak_memory_kind']}")
    if path is not None:
        lines.append(f"result: {path}")
    return "\n".join(lines)


# What `python -m benchmarks.pretrain_throughput` runs: its job on its primary config,
# benchmarks/conf/bench_pretrain.yaml.
CONFIG = "bench_pretrain"
JOB = Job("benchmarks.pretrain_throughput:benchmark_pretrain_throughput", RESULT_FILE)

if __name__ == "__main__":
    main(JOB, CONFIG)
