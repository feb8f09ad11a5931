"""The bench_step job: what the host spends on one training step, three ways (`bare`: a PyTorch
loop with nothing around the step; `plain`: transformers.Trainer; `bertkit`: bertkit's trainer
and the callbacks every run carries), on the same small BERT and pre-built batches, in one
process; host syncs per step from a separate untimed run per way. docs/speed.md ("How
bench-step compares") says what is timed. Writes bench_step.json and prints a markdown table.

The pretraining_packed workload feeds the pretraining workload's sequences (lengths drawn
alike) as padding-free batches (bertkit.pretraining.batches) of the same token budget: the
CPU proxy of what packing gains on a GPU, in real tokens per step and the padded share, beside
what a step costs here."""

from __future__ import annotations

import copy
import dataclasses
import logging
import statistics
from pathlib import Path

import numpy as np
import torch
import transformers
from omegaconf import DictConfig, OmegaConf
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    PrinterCallback,
    Trainer,
    get_scheduler,
    set_seed,
)

from benchmarks.command import main
from benchmarks.host_syncs import HostSyncCounter
from benchmarks.measure import StepSpan, device_name, ratio, timed
from benchmarks.report import markdown_head, publish
from benchmarks.settings import check_setting, check_settings
from benchmarks.side_by_side import (
    Schedule,
    check_steps,
    one_batch_a_step,
    one_process,
    release,
    remove_if_empty,
    run_ways,
)
from bertkit.errors import BertkitError
from bertkit.jobs import Job
from bertkit.pretraining import batches as padding_free
from bertkit.pretraining.batches import Phase
from bertkit.pretraining.masking import IGNORE_INDEX
from bertkit.pretraining.model import MaskedOnlyBertForPreTraining, use_padding_free_attention
from bertkit.pretraining.trainer import PretrainingTrainer
from bertkit.training.models import count_parameters
from bertkit.training.run import build_training_arguments, hydra_run_dir
from bertkit.training.stop_and_resume import ClockCallback, PreemptionCallback, TrainingClock
from bertkit.training.throughput import add_throughput
from bertkit.training.trainer import BertkitTrainer

logger = logging.getLogger(__name__)

RESULT_FILE = "bench_step.json"
WAYS = ("bare", "plain", "bertkit")
WORKLOADS = ("pretraining", "pretraining_packed", "glue")
RATIOS = (("bertkit", "bare"), ("plain", "bare"), ("bertkit", "plain"))
BERTKIT_TRAINERS = {"pretraining": PretrainingTrainer, "pretraining_packed": PretrainingTrainer,
                    "glue": BertkitTrainer}
PAD_ID = 0  # ids are drawn from [1, vocab_size)


# -- the batches ------------------------------------------------------------------------------
def _rows(settings: DictConfig, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(real length of each row, position index): padded_share of the rows shorter."""
    batch, width = int(settings.batch_size), int(settings.seq_length)
    lengths = np.full(batch, width)
    short = rng.random(batch) < float(settings.padded_share)
    lengths[short] = rng.integers(int(settings.min_length), width, size=int(short.sum()))
    return lengths, np.arange(width)[None, :]


def _encoder_inputs(lengths, position, vocab_size: int, rng) -> dict[str, np.ndarray]:
    """Random ids, two segments split at random, padding (id 0, mask 0) after each length."""
    real = position < lengths[:, None]
    split = rng.integers(1, lengths - 1)[:, None]
    ids = rng.integers(PAD_ID + 1, vocab_size, size=real.shape)
    return {"input_ids": np.where(real, ids, PAD_ID),
            "token_type_ids": (real & (position >= split)).astype(np.int64),
            "attention_mask": real.astype(np.int64)}


def pretraining_batch(settings: DictConfig, vocab_size: int, rng) -> dict[str, np.ndarray]:
    """What bertkit's pretraining collator feeds MaskedOnlyBertForPreTraining: mlm_used of the
    mlm_slots slots at distinct positions inside each row ([CLS] and the last token left out),
    the rest position 0 with label -100; a random NSP label per row."""
    lengths, position = _rows(settings, rng)
    batch = _encoder_inputs(lengths, position, vocab_size, rng)
    slots, used = int(settings.mlm_slots), int(settings.mlm_used)
    inside = (position > 0) & (position < lengths[:, None] - 1)
    keys = np.where(inside, rng.random(inside.shape), np.inf)
    positions = np.zeros((len(lengths), slots), dtype=np.int64)
    positions[:, :used] = np.argsort(keys, axis=1)[:, :used]
    labels = np.full((len(lengths), slots), IGNORE_INDEX)
    labels[:, :used] = rng.integers(PAD_ID + 1, vocab_size, size=(len(lengths), used))
    return {**batch, "mlm_positions": positions, "mlm_labels": labels,
            "next_sentence_label": rng.integers(0, 2, size=len(lengths))}


def packed_pretraining_batch(settings: DictConfig, vocab_size: int, rng) -> dict:
    """What bertkit's padding-free collator feeds: sequences of the pretraining workload's
    lengths, as many as PackedBatches fits in batch_size x seq_length tokens, end to end; each
    with mlm_used x its length / seq_length masked slots (at least 1), a random NSP label."""
    batch, width = int(settings.batch_size), int(settings.seq_length)
    pool = np.concatenate([_rows(settings, rng)[0] for _ in range(4)])
    predictions = np.maximum(1, np.round(int(settings.mlm_used) * pool / width)).astype(int)
    shape = padding_free.pack_shapes([(width, int(settings.mlm_slots), float(pool.mean()))],
                                     batch, float(settings.sequence_slot_headroom))[0]
    chosen = next(iter(padding_free.PackedBatches(
        [Phase(0, pool, batch)], [shape], [predictions], [1], seed=int(rng.integers(2**31)))))
    lengths, count = pool[chosen], len(chosen)
    total, starts = int(lengths.sum()), np.cumsum(pool[chosen]) - pool[chosen]
    position = np.zeros(shape.tokens, dtype=np.int64)
    position[:total] = np.arange(total) - np.repeat(starts, lengths)
    ids = np.full(shape.tokens, PAD_ID)
    ids[:total] = rng.integers(PAD_ID + 1, vocab_size, size=total)
    split = np.repeat(rng.integers(1, lengths - 1), lengths)
    types = np.zeros(shape.tokens, dtype=np.int64)
    types[:total] = position[:total] >= split
    slots = np.zeros(shape.predictions, dtype=np.int64)
    labels = np.full(shape.predictions, IGNORE_INDEX)
    used = 0
    for start, length, predicted in zip(starts, lengths, predictions[chosen], strict=True):
        inside = start + 1 + rng.permutation(length - 2)[:predicted]  # not [CLS] nor the last
        slots[used:used + len(inside)] = np.sort(inside)
        labels[used:used + len(inside)] = rng.integers(PAD_ID + 1, vocab_size, len(inside))
        used += len(inside)
    sequence_lengths = np.zeros(shape.sequences, dtype=np.int64)
    sequence_lengths[:count] = lengths
    sentence = np.full(shape.sequences, IGNORE_INDEX)
    sentence[:count] = rng.integers(0, 2, size=count)
    return {"input_ids": ids[None], "token_type_ids": types[None], "position_ids": position[None],
            padding_free.SEQUENCE_LENGTHS: sequence_lengths, padding_free.MAX_LENGTH: width,
            "mlm_positions": slots[None], "mlm_labels": labels[None],
            "next_sentence_label": sentence}


def glue_batch(settings: DictConfig, vocab_size: int, rng) -> dict[str, np.ndarray]:
    lengths, position = _rows(settings, rng)
    batch = _encoder_inputs(lengths, position, vocab_size, rng)
    return {**batch, "labels": rng.integers(0, int(settings.num_labels), size=len(lengths))}


BATCHES = {"pretraining": pretraining_batch, "pretraining_packed": packed_pretraining_batch,
           "glue": glue_batch}


def build_batches(bench: DictConfig, seed: int,
                  workload: str) -> list[dict[str, torch.Tensor]]:
    """The workload's distinct batches (seeded), as int64 tensors on the host."""
    settings = bench[workload]
    rng = np.random.default_rng(int(seed))
    vocab_size = int(bench.model.vocab_size)
    return [{name: value if isinstance(value, int)  # a packed batch's phase length
             else torch.from_numpy(np.ascontiguousarray(value, dtype=np.int64))
             for name, value in BATCHES[workload](settings, vocab_size, rng).items()}
            for _ in range(int(settings.batches))]


def real_tokens(batch: dict) -> tuple[int, int]:
    """(real tokens, positions) of a batch: padded by its attention mask, packed by its
    sequences' lengths."""
    lengths = batch.get(padding_free.SEQUENCE_LENGTHS)
    real = batch["attention_mask"].sum() if lengths is None else lengths.sum()
    return int(real), batch["input_ids"].numel()


class StepIndices(torch.utils.data.Dataset):
    """n items, each its own index: what Trainer's sampler and DataLoader iterate over."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index


class FeedBatches:
    """The data collator: the next pre-built batch, whatever the indices. A shallow copy, as a
    collator builds a new dict: bertkit's wrapper drops a full attention mask from it."""

    def __init__(self, batches: list[dict]):
        self.batches = batches
        self.fed = 0

    def __call__(self, features) -> dict:
        batch = dict(self.batches[self.fed % len(self.batches)])
        self.fed += 1
        return batch


# -- the model and the arguments ------------------------------------------------------------------
def initial_model(bench: DictConfig, seed: int, workload: str) -> torch.nn.Module:
    """The workload's model from the seeded init (every run trains a deep copy of it)."""
    options = OmegaConf.to_container(bench.model, resolve=True)
    set_seed(int(seed))
    if workload == "glue":
        config = BertConfig(pad_token_id=PAD_ID, num_labels=int(bench.glue.num_labels),
                            **options)
        return BertForSequenceClassification(config)
    model = MaskedOnlyBertForPreTraining(BertConfig(pad_token_id=PAD_ID, **options))
    if workload == "pretraining_packed":
        use_padding_free_attention(model)
    return model


@dataclasses.dataclass(frozen=True)
class _Job:
    """What the benchmark's steps read of its config, taken once at its entry."""

    arguments: DictConfig  # the config TrainingArguments are built from
    bench: DictConfig
    seed: int
    throughput: DictConfig | None
    agree_every_steps: int


def _arguments(job: _Job, workload: str, steps: int, run_dir: Path):
    """TrainingArguments of one run (a fresh object each: bertkit's trainer edits its own)."""
    options = {# TrainingArguments the trainer group's schema does not hold: a plain node.
               **OmegaConf.to_container(job.bench.trainer, resolve=True),
               **OmegaConf.to_container(job.bench[workload].trainer, resolve=True),
               "max_steps": steps,
               "per_device_train_batch_size": int(job.bench[workload].batch_size)}
    return build_training_arguments(job.arguments, run_dir, [], options)


def _trainer(job: _Job, way: str, workload: str, model, args, batches) -> Trainer:
    """The plain Trainer, or bertkit's with what a bertkit run adds around it
    (bertkit.training.run.train_run and its attach_callbacks: the clock's callback, the throughput
    meter first, the preemption callback)."""
    dataset = StepIndices(args.max_steps * args.per_device_train_batch_size)
    trainer_class = Trainer if way == "plain" else BERTKIT_TRAINERS[workload]
    trainer = trainer_class(model=model, args=args, train_dataset=dataset,
                            data_collator=FeedBatches(batches))
    trainer.remove_callback(PrinterCallback)  # its end-of-train line, in both
    if way == "bertkit":
        trainer.add_callback(ClockCallback(TrainingClock(), None))
        add_throughput(job.throughput, trainer)
        trainer.add_callback(PreemptionCallback(agree_every_steps=job.agree_every_steps))
    return trainer


# -- the bare loop ----------------------------------------------------------------------------
class BareLoop:
    """The step with nothing around it: Trainer's optimizer (fused AdamW, weight decay off
    biases and LayerNorm), clipping and schedule from the same arguments."""

    def __init__(self, model, args, steps: int):
        self.model, self.args = model.to(args.device), args
        named = list(model.named_parameters())
        no_decay = [p for name, p in named if "bias" in name or "LayerNorm" in name]
        decay = [p for name, p in named if not ("bias" in name or "LayerNorm" in name)]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": args.weight_decay},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2),
            eps=args.adam_epsilon, fused=True)
        self.scheduler = get_scheduler(args.lr_scheduler_type, self.optimizer,
                                       num_warmup_steps=args.get_warmup_steps(steps),
                                       num_training_steps=steps)

    def step(self, batch: dict) -> None:
        batch = {name: value.to(self.args.device) if isinstance(value, torch.Tensor) else value
                 for name, value in batch.items()}
        loss = self.model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.args.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def run(self, batches: list[dict], steps: int, counter: HostSyncCounter | None = None):
        """`steps` steps over the batches, cycled (the counter told each step's number)."""
        self.model.train()
        for index in range(steps):
            if counter is not None:
                counter.step = index + 1
            self.step(batches[index % len(batches)])


# -- one run of each kind ---------------------------------------------------------------------
def _run(job: _Job, way: str, workload: str, initial, batches, steps: int,
         run_dir: Path) -> float:
    """Seconds of `steps` optimizer steps from a copy of the initial weights."""
    args = _arguments(job, workload, steps, run_dir)
    model = copy.deepcopy(initial)
    set_seed(args.seed)
    if way == "bare":
        loop = BareLoop(model, args, steps)
        return timed(loop.run, batches, steps)[1]
    trainer = _trainer(job, way, workload, model, args, batches)
    timer = StepSpan()
    trainer.add_callback(timer)
    output = trainer.train()
    check_steps(way, output.global_step, steps)
    return timer.seconds


def _syncs(job: _Job, way: str, workload: str, initial, batches, steps: int,
           run_dir: Path) -> dict:
    """Host syncs per optimizer step, over the steps that did not log (for the Trainers: all
    but the last, which holds the end-of-training log line), and where they came from."""
    args = _arguments(job, workload, steps, run_dir)
    model = copy.deepcopy(initial)
    set_seed(args.seed)
    counter = HostSyncCounter()
    if way == "bare":
        loop = BareLoop(model, args, steps)
        with counter:
            loop.run(batches, steps, counter)
        quiet = list(range(1, steps + 1))
    else:
        trainer = _trainer(job, way, workload, model, args, batches)
        marks = counter.watch(trainer)
        with counter:
            trainer.train()
        quiet = [step for step in range(1, steps + 1) if step not in marks.logged_steps]
    per_step = counter.per_step()
    return {"syncs_per_step": sum(per_step[step] for step in quiet) / len(quiet),
            "steps_counted": len(quiet),
            "sync_sources": {f"{op} at {caller}": count / len(quiet)
                             for (op, caller), count in counter.where(quiet).most_common()}}


# -- the job ----------------------------------------------------------------------------------
def _check(bench: DictConfig, trainer: DictConfig) -> tuple[Schedule, list[str]]:
    schedule = Schedule.read(bench)
    check_setting("bench.sync_steps", bench.sync_steps)  # for a direct call: the schema's
    workloads = list(bench.workloads)
    if not workloads or set(workloads) - set(WORKLOADS):
        raise BertkitError(f"bench.workloads={workloads}: expected some of {', '.join(WORKLOADS)}")
    for workload in workloads:
        settings = bench[workload]
        # Each limit named by the key the user set: [CLS], [SEP] and (pretraining) the used
        # MLM slots fit the shortest row, the longest fits the model's positions.
        key, positions = f"bench.{workload}", int(bench.model.max_position_embeddings)
        pretraining = workload.startswith("pretraining")
        least, why = ((int(settings.mlm_used) + 2, f"{key}.mlm_used + 2")
                      if pretraining else (3, "[CLS], a token and [SEP]"))
        if int(settings.min_length) < least:
            raise BertkitError(f"{key}.min_length={settings.min_length}: expected at least "
                               f"{least} ({why})")
        if int(settings.min_length) >= int(settings.seq_length):
            raise BertkitError(f"{key}.min_length={settings.min_length}: expected less than "
                               f"{key}.seq_length={settings.seq_length}")
        if int(settings.seq_length) > positions:
            raise BertkitError(f"{key}.seq_length={settings.seq_length} exceeds the {positions} "
                               f"positions of bench.model.max_position_embeddings: lower "
                               f"{key}.seq_length to at most {positions}")
        if pretraining and int(settings.mlm_used) > int(settings.mlm_slots):
            raise BertkitError(f"{key}: mlm_used must be at most mlm_slots")
    one_batch_a_step(trainer, "as the bare loop runs")
    return schedule, workloads


def _workload(job: _Job, workload: str, schedule: Schedule, run_dir: Path) -> dict:
    bench = job.bench
    batches = build_batches(bench, job.seed, workload)
    initial = initial_model(bench, job.seed, workload)

    def run(way: str, steps: int, timed: bool) -> float:
        seconds = _run(job, way, workload, initial, batches, steps, run_dir)
        release()
        return seconds

    seconds = run_ways(WAYS, schedule, run, label=f"bench {workload}")
    ways = {}
    for way in WAYS:
        logger.info("bench %s %s: counting host syncs, %d steps (not timed)", workload, way,
                    int(bench.sync_steps))
        syncs = _syncs(job, way, workload, initial, batches, int(bench.sync_steps), run_dir)
        release()
        each = [1000 * value / schedule.steps for value in seconds[way]]
        ways[way] = {"ms_per_step": statistics.median(each), "ms_per_step_each_repeat": each,
                     **syncs}
    real, positions = (sum(counts) for counts in zip(*map(real_tokens, batches), strict=True))
    return {
        "model_class": type(initial).__name__,
        "num_parameters": count_parameters(initial),
        **{key: value for key, value in OmegaConf.to_container(bench[workload],
                                                                resolve=True).items()
           if key != "trainer"},
        "real_token_share": real / positions,
        "real_tokens_per_step": real / len(batches),
        "trainer_settings": OmegaConf.to_container(bench[workload].trainer, resolve=True),
        "ways": ways,
        "ratio": {f"{a}/{b}": ratio(ways[a]["ms_per_step"], ways[b]["ms_per_step"])
                  for a, b in RATIOS},
    }


def benchmark_step_cost(cfg: DictConfig, run_dir: Path | None = None) -> dict:
    check_settings(cfg)
    run_dir = Path(run_dir or hydra_run_dir())
    schedule, workloads = _check(cfg.bench, cfg.trainer)
    job = _Job(cfg, cfg.bench, cfg.seed, OmegaConf.select(cfg, "throughput"),
               cfg.agree_every_steps)
    probe = _arguments(job, workloads[0], schedule.steps, run_dir)
    one_process(cfg.bench, probe, "it times one process's steps")
    results = {workload: _workload(job, workload, schedule, run_dir) for workload in workloads}
    remove_if_empty(run_dir / "checkpoints")
    bench = cfg.bench
    result = {
        "recipe": cfg.recipe.name,
        "device": probe.device.type,
        "device_name": device_name(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        **schedule.fields(),
        "sync_steps": int(bench.sync_steps),
        "seed": probe.seed,
        "model": OmegaConf.to_container(bench.model, resolve=True),
        "trainer": {"optim": _name(probe.optim), "learning_rate": probe.learning_rate,
                    "lr_scheduler_type": _name(probe.lr_scheduler_type),
                    "warmup_steps": probe.warmup_steps, "weight_decay": probe.weight_decay,
                    "max_grad_norm": probe.max_grad_norm, "logging_steps": probe.logging_steps,
                    **OmegaConf.to_container(bench.trainer)},
        "timing": "wall time from the first step's start to the last step's end (Trainer's "
                  "setup and the bare loop's optimizer building left out), divided by steps; "
                  "median over repeats in "
                  "alternating order; each way first ran warmup_steps steps on a throwaway "
                  "copy (not timed)",
        "syncs": "host syncs (benchmarks.host_syncs) per optimizer step in one "
                 "separate untimed run of sync_steps steps per way, the collator's own work "
                 "and the Trainers' last (logging) step left out",
        "workloads": results,
    }
    publish(result, run_dir / RESULT_FILE, table)
    return result


def _name(setting) -> str:
    """A TrainingArguments enum as its value ("adamw_torch_fused")."""
    return str(getattr(setting, "value", setting))


def table(result: dict, path: Path | None = None) -> str:
    """One markdown row per workload: ms/step of each way, the ratios, syncs per step."""
    model = result["model"]
    lines = [
        f"\nbench_step: {result['steps']} steps x {result['repeats']} repeat(s), "
        f"{result['warmup_steps']} warm-up steps not timed; {model['num_hidden_layers']}x"
        f"{model['hidden_size']} BERT (vocab {model['vocab_size']:,}), {result['device_name']}, "
        f"{result['torch_threads']} thread(s), torch {result['torch']}, transformers "
        f"{result['transformers']}\n",
        *markdown_head("workload", "batch", "real tokens/step", "padding", "bare ms/step",
                       "plain ms/step", "bertkit ms/step", "bertkit/bare", "plain/bare",
                       "bertkit/plain", "syncs/step bare / plain / bertkit"),
    ]
    for name, workload in result["workloads"].items():
        ways, ratio = workload["ways"], workload["ratio"]
        syncs = " / ".join(f"{ways[way]['syncs_per_step']:g}" for way in WAYS)
        lines.append(f"| {name} | {workload['batch_size']} x {workload['seq_length']} "
                     f"| {workload['real_tokens_per_step']:,.0f} "
                     f"| {1 - workload['real_token_share']:.1%} "
                     + "".join(f"| {ways[way]['ms_per_step']:.1f} " for way in WAYS)
                     + "".join(f"| {ratio[f'{a}/{b}']:.2f}x " for a, b in RATIOS)
                     + f"| {syncs} |")
    lines.extend(packing_lines(result["workloads"]))
    if path is not None:
        lines.append(f"\nresult: {path}")
    return "\n".join(lines)


def packing_lines(workloads: dict) -> list[str]:
    """The CPU proxy of padding-free batches: useful work per step, and per ms of bertkit's
    step here (a GPU's step costs about what its positions cost; a CPU's also pays the
    sequence slots' attention)."""
    if not {"pretraining", "pretraining_packed"} <= set(workloads):
        return []
    padded, packed = workloads["pretraining"], workloads["pretraining_packed"]
    per_ms = {name: w["real_tokens_per_step"] / w["ways"]["bertkit"]["ms_per_step"]
              for name, w in (("padded", padded), ("packed", packed))}
    return [f"\npadding-free vs padded, same token budget: "
            f"{packed['real_tokens_per_step'] / padded['real_tokens_per_step']:.3f}x the real "
            f"tokens per step (padding {1 - padded['real_token_share']:.1%} -> "
            f"{1 - packed['real_token_share']:.1%}); on this device "
            f"{per_ms['packed'] / per_ms['padded']:.3f}x the real tokens per ms of bertkit's step"]


# What `python -m benchmarks.step_cost` runs: its job on its primary config,
# benchmarks/conf/bench_step.yaml.
CONFIG = "bench_step"
JOB = Job("benchmarks.step_cost:benchmark_step_cost", RESULT_FILE)

if __name__ == "__main__":
    main(JOB, CONFIG)
