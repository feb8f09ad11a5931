"""The bench_pretrain_quality job: time to quality, bertkit's budget pretraining
(experiment=pretrain_budget) against the plain Hugging Face way (run_mlm.py, written out below,
at a small sweep of learning rates), for the same wall-clock budget in one process, scored on
the same held-out masked positions. docs/speed.md ("How bench-pretrain-quality
compares") says what is held equal and what is reported. Writes bench_pretrain_quality.json and
pretrain_quality.png, and prints a markdown table."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import datasets
import torch
from matplotlib.figure import Figure
from omegaconf import DictConfig, OmegaConf
from transformers import (
    BertConfig,
    BertForMaskedLM,
    DataCollatorForLanguageModeling,
    PreTrainedTokenizerBase,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    set_seed,
)

from benchmarks.command import main
from benchmarks.measure import device_name
from benchmarks.report import markdown_head
from benchmarks.settings import check_settings
from bertkit.data.atomic_files import write_json_atomic
from bertkit.errors import BertkitError
from bertkit.jobs import Job
from bertkit.pretraining.heldout import (
    HeldoutEvaluation,
    build_heldout,
    heldout_curve,
    heldout_fingerprint,
)
from bertkit.pretraining.objective import objective_of
from bertkit.pretraining.run import (
    pretrain,
    pretraining_tokenizer,
    split_corpus,
)
from bertkit.reporting.plots import save_figure_atomic
from bertkit.training import run as training_run
from bertkit.training.model_card import (
    CardDataset,
    CardFacts,
    build_card,
    command_line,
    heldout_scores,
    write_card,
)
from bertkit.training.run import hydra_run_dir, resolve_mixed_precision
from bertkit.training.stop_and_resume import ClockCallback, TrainingClock

logger = logging.getLogger(__name__)

RESULT_FILE = "bench_pretrain_quality.json"
FIGURE_FILE = "pretrain_quality.png"


# The plain way's data: run_mlm.py's tokenize_function and group_texts.


def _document_text(batch: dict) -> dict:
    return {"text": [" ".join(sentences) for sentences in batch["sentences"]]}


def grouped_blocks(documents: datasets.Dataset, tokenizer: PreTrainedTokenizerBase,
                   block_size: int, num_proc: int | None = None) -> datasets.Dataset:
    """run_mlm.py without --line_by_line: tokenize each text (special tokens included), then
    concatenate all of it and cut blocks of block_size; the remainder is dropped."""
    texts = documents.map(_document_text, batched=True, remove_columns=documents.column_names,
                          num_proc=num_proc, desc="plain: document texts")

    def tokenize(batch):
        return tokenizer(batch["text"], return_special_tokens_mask=True)

    tokenized = texts.map(tokenize, batched=True, remove_columns=["text"], num_proc=num_proc,
                          desc="plain: tokenizing (run_mlm.py)")

    def group_texts(batch):
        concatenated = {key: sum(batch[key], []) for key in batch}
        total = (len(concatenated["input_ids"]) // block_size) * block_size
        return {key: [values[i:i + block_size] for i in range(0, total, block_size)]
                for key, values in concatenated.items()}

    # run_mlm.py groups in batches of 1,000 texts; documents here are whole articles and books,
    # so one batch holds the whole corpus and only one final remainder is dropped.
    return tokenized.map(group_texts, batched=True, batch_size=len(tokenized),
                         desc=f"plain: grouping texts in blocks of {block_size}")


def plain_model(plain: DictConfig, model: DictConfig, tokenizer: PreTrainedTokenizerBase,
                seed: int):
    """BertForMaskedLM from random init with the same architecture (model.config); dropout as
    run_mlm.py leaves it (BertConfig's 0.1) unless bench.plain.dropout (plain) says otherwise."""
    set_seed(seed)
    dropout = plain.dropout
    config = BertConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
                        **OmegaConf.to_container(model.config))
    return BertForMaskedLM(config)


def plain_arguments(plain: DictConfig, mixed_precision: str, seed: int, output_dir: Path,
                    learning_rate: float, max_steps: int) -> TrainingArguments:
    """plain: bench.plain; mixed_precision: the run's (resolved the same as the bertkit
    way's)."""
    precision = resolve_mixed_precision(mixed_precision)
    return TrainingArguments(
        output_dir=str(output_dir), learning_rate=learning_rate, max_steps=max_steps,
        per_device_train_batch_size=plain.batch_size, warmup_steps=float(plain.warmup_ratio),
        lr_scheduler_type="linear", weight_decay=plain.weight_decay, optim="adamw_torch",
        seed=seed, save_strategy="no", logging_steps=plain.logging_steps, report_to=[],
        disable_tqdm=True, dataloader_pin_memory=False, use_cpu=not torch.cuda.is_available(),
        bf16=precision == "bf16", fp16=precision == "fp16",
        include_num_input_tokens_seen="non_padding")


class StopAtSeconds(TrainerCallback):
    """The plain way trains by steps; this only makes sure it never runs past the budget when
    the timed estimate of its steps was short."""

    def __init__(self, clock: TrainingClock, seconds: float):
        self.clock, self.seconds, self.stopped = clock, seconds, False

    def on_step_end(self, args, state, control, **kwargs):
        if self.clock.elapsed() >= self.seconds and state.global_step < state.max_steps:
            self.stopped = control.should_training_stop = True  # cut before its last step
        return control


@dataclasses.dataclass(frozen=True)
class _PlainWay:
    """What the plain way's arms read of the config, taken once at the entry."""

    plain: DictConfig  # bench.plain
    model: DictConfig
    seed: int
    mixed_precision: str
    budget_minutes: float  # budget.minutes
    heldout: DictConfig
    model_card: DictConfig
    corpus: DictConfig
    max_seq_length: int  # pretraining.max_seq_length


def steps_in_budget(way: _PlainWay, blocks, tokenizer, collator, seconds: float,
                    work_dir: Path) -> tuple[int, float]:
    """(steps that fit the budget, seconds per step): bench.plain.timing_steps steps of a
    throwaway model, after one untimed step, on a training clock like the arms'."""
    timing = int(way.plain.timing_steps)
    model = plain_model(way.plain, way.model, tokenizer, way.seed)
    args = plain_arguments(way.plain, way.mixed_precision, way.seed, work_dir / "timing",
                           1e-4, timing + 1)
    trainer = Trainer(model=model, args=args, train_dataset=blocks, data_collator=collator)
    clock = training_run.training_clock()
    marks: list[float] = []

    class Marks(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            marks.append(clock.elapsed())

    trainer.add_callback(ClockCallback(clock, None))
    trainer.add_callback(Marks())
    trainer.train()
    per_step = (marks[-1] - marks[0]) / (len(marks) - 1)
    return max(1, int(seconds / per_step)), per_step


def time_to_reach(curve: list[dict], target: float) -> float | None:
    """Training seconds at which a held-out curve first reaches `target` (linear between two
    evaluations), or None if it never does."""
    previous = None
    for point in curve:
        if point["mlm_loss"] <= target:
            if previous is None:
                return point["elapsed_seconds"]
            share = (previous["mlm_loss"] - target) / (previous["mlm_loss"] - point["mlm_loss"])
            return previous["elapsed_seconds"] + share * (
                point["elapsed_seconds"] - previous["elapsed_seconds"])
        previous = point
    return None


def plot_curves(arms: dict[str, list[dict]], path: Path, title: str) -> Path:
    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for label, curve in arms.items():
        ax.plot([p["elapsed_seconds"] / 60 for p in curve], [p["mlm_loss"] for p in curve],
                marker="o", markersize=2.5, label=label)
    ax.set_xlabel("training time (minutes, this machine)")
    ax.set_ylabel("held-out MLM loss (same masked positions)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return save_figure_atomic(fig, path)


def check_bench(budget_minutes: float | None, objective: DictConfig, bench: DictConfig,
                heldout: DictConfig) -> None:
    """budget_minutes: budget.minutes (None: unset)."""
    if budget_minutes is None:
        raise BertkitError("bench_pretrain_quality compares two ways at one time budget: set "
                           "budget.minutes")
    if objective_of(objective).sentence_task is not None:
        raise BertkitError("bench_pretrain_quality compares masked LM alone (run_mlm.py has "
                           "no NSP): use objective=mlm")
    if not bench.plain.learning_rates:
        raise BertkitError("bench.plain.learning_rates: give at least one learning rate")
    if not float(heldout.fraction) > 0:
        raise BertkitError("bench_pretrain_quality scores both ways on the held-out set: "
                           "heldout.fraction must be positive")


def _summary(result: dict) -> dict:
    arms = result["arms"]
    plain = {name: arm for name, arm in arms.items() if name != "bertkit"}
    if "bertkit" not in arms or not plain:
        return {}
    best_name = min(plain, key=lambda name: plain[name]["final"]["mlm_loss"])
    best = plain[best_name]
    target = best["final"]["mlm_loss"]
    reached = time_to_reach(arms["bertkit"]["curve"], target)
    plain_seconds = best["final"]["elapsed_seconds"]
    return {"best_plain": best_name, "target_mlm_loss": target,
            "plain_seconds": plain_seconds, "bertkit_seconds_to_target": reached,
            "time_ratio": None if reached is None else reached / plain_seconds,
            "bertkit_final_mlm_loss": arms["bertkit"]["final"]["mlm_loss"]}


def table(result: dict) -> str:
    lines = markdown_head("arm", "learning rate", "steps", "final held-out MLM loss", "accuracy",
                          "seconds")
    for name, arm in result["arms"].items():
        final = arm["final"]
        lines.append(f"| {name} | {arm['learning_rate']:g} | {arm['steps']} | "
                     f"{final['mlm_loss']:.4f} | {final['mlm_accuracy']:.4f} | "
                     f"{final['elapsed_seconds']:.0f} |")
    summary = result.get("summary") or {}
    if summary.get("time_ratio") is not None:
        lines.append(f"\nbertkit reaches the best plain arm's final loss "
                     f"({summary['target_mlm_loss']:.4f}, {summary['best_plain']}) after "
                     f"{summary['bertkit_seconds_to_target']:.0f} s: "
                     f"**{summary['time_ratio']:.2f}** of the plain way's "
                     f"{summary['plain_seconds']:.0f} s")
    elif summary:
        lines.append(f"\nbertkit does not reach the best plain arm's final loss "
                     f"({summary['target_mlm_loss']:.4f}) within the budget")
    return "\n".join(lines)


def plain_arm_name(learning_rate: float) -> str:
    return f"plain lr={learning_rate:g}"


def arm_directory(name: str) -> str:
    """"plain lr=0.0005" -> plain_lr0.0005: no "=" in a path a Hydra override may name
    (model.name_or_path=<arm>/model)."""
    return name.replace(" ", "_").replace("=", "")


def arm_order(bench: DictConfig) -> list[tuple[str, float | None]]:
    """bertkit first (the checkpoint the downstream comparison needs most), then the plain
    way at each learning rate of its sweep."""
    plain = [(plain_arm_name(float(rate)), float(rate)) for rate in bench.plain.learning_rates]
    return [("bertkit", None), *plain]


def _plain_arm(way: _PlainWay, tokenizer, collator, heldout, blocks, learning_rate: float,
               steps: int, work_dir: Path) -> dict:
    budget_seconds = float(way.budget_minutes) * 60
    model = plain_model(way.plain, way.model, tokenizer, way.seed)
    trainer = Trainer(model=model, args=plain_arguments(way.plain, way.mixed_precision,
                                                        way.seed, work_dir, learning_rate,
                                                        steps),
                      train_dataset=blocks, data_collator=collator)
    # Measurement only: the clock (evaluations paused out of it), the held-out evaluation at
    # the bertkit way's interval, and a stop should the timed step estimate fall short.
    clock = training_run.training_clock()
    trainer.add_callback(ClockCallback(clock, None))
    trainer.add_callback(HeldoutEvaluation(
        trainer, heldout, clock, batch_size=way.heldout.batch_size,
        every_seconds=way.heldout.every_seconds, every_steps=way.heldout.every_steps,
        tokenizer=tokenizer))
    stop = StopAtSeconds(clock, budget_seconds)
    trainer.add_callback(stop)
    trainer.train()
    trainer.save_model(str(work_dir / "model"))
    tokenizer.save_pretrained(str(work_dir / "model"))
    curve = heldout_curve(trainer.state.log_history)
    arm = {"learning_rate": learning_rate, "steps": trainer.state.global_step,
           "planned_steps": steps, "stopped_by_time": stop.stopped,
           "tokens_seen": int(trainer.state.num_input_tokens_seen),
           "model": str(work_dir / "model"), "curve": curve, "final": curve[-1]}
    if way.model_card.enabled:
        write_card(build_card(_plain_card(way, arm, trainer.args), way.model_card,
                              command_line()), work_dir / "model")
    return arm


def _plain_card(way: _PlainWay, arm: dict, args: TrainingArguments) -> CardFacts:
    """The plain arm's model card: its held-out scores, on the bertkit arm's held-out set."""
    plain = way.plain
    return CardFacts(
        model_name=f"bench-pretrain-quality-{arm_directory(plain_arm_name(arm['learning_rate']))}",
        family="pretraining",
        summary=(f"The plain way of bertkit's time-to-quality benchmark (bench_pretrain_quality):"
                 f" BertForMaskedLM from random initialisation, trained with Trainer and "
                 f"run_mlm.py's recipe for a {way.budget_minutes:g}-minute budget on "
                 f"{way.corpus.name}. A comparison arm, not a recipe."),
        started_from=None, dataset=CardDataset.of(way.corpus),
        results={"heldout": heldout_scores(arm["final"])},
        results_note=(f"The benchmark's held-out masked positions (the same for every arm), at "
                      f"step {arm['final']['step']}."),
        hyperparameters={"learning_rate": args.learning_rate,
                         "per_device_train_batch_size": args.per_device_train_batch_size,
                         "max_steps": args.max_steps, "warmup_ratio": plain.warmup_ratio,
                         "weight_decay": args.weight_decay,
                         "mlm_probability": plain.mlm_probability,
                         "max_seq_length": way.max_seq_length,
                         "hidden_dropout_prob": plain.dropout,
                         "attention_probs_dropout_prob": plain.dropout},
        seed=way.seed,
        training={key: arm[key] for key in ("steps", "planned_steps", "stopped_by_time",
                                            "tokens_seen")})


def _bertkit_arm(cfg: DictConfig, run_dir: Path) -> dict:
    record = pretrain(cfg, run_dir)
    heldout = record["heldout"]
    return {"learning_rate": float(cfg.trainer.learning_rate), "steps": record["train"]["steps"],
            "tokens_seen": record["train"].get("tokens_seen"), "model": str(run_dir / "model"),
            "curve": heldout["curve"], "final": heldout["final"]}


def _read_result(path: Path) -> dict:
    """An earlier, interrupted benchmark's arms, so that a rerun only runs what is missing."""
    if not path.exists():
        return {"arms": {}}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        raise BertkitError(f"{path}: not valid JSON; remove it to start the benchmark "
                           f"again") from None


def benchmark_pretrain_quality(cfg: DictConfig, run_dir: Path | None = None) -> dict:
    check_settings(cfg)
    run_dir = Path(run_dir or hydra_run_dir())
    check_bench(OmegaConf.select(cfg, "budget.minutes"), cfg.objective, cfg.bench, cfg.heldout)
    path = run_dir / RESULT_FILE
    result = _read_result(path)
    result["settings"] = {"budget_minutes": float(cfg.budget.minutes),
                          "model": OmegaConf.to_container(cfg.model.config),
                          "corpus": cfg.corpus.name, "seed": cfg.seed,
                          "device": device_name(),
                          "plain": OmegaConf.to_container(cfg.bench.plain, resolve=True)}
    budget_seconds = float(cfg.budget.minutes) * 60
    # The plain way's data: the same split and vocabulary as the bertkit way's run.
    train_docs, heldout_docs = split_corpus(cfg)
    tokenizer = pretraining_tokenizer(cfg.tokenizer_training, cfg.model, cfg.corpus,
                                      cfg.cache_dir, train_docs)
    heldout = build_heldout(cfg.heldout, cfg.pretraining, cfg.objective, tokenizer, heldout_docs)
    result["settings"]["heldout_fingerprint"] = heldout_fingerprint(heldout.mlm)
    blocks = grouped_blocks(train_docs, tokenizer, cfg.pretraining.max_seq_length,
                            cfg.preprocessing_num_workers)
    result["settings"]["plain_blocks"] = len(blocks)
    collator = DataCollatorForLanguageModeling(tokenizer,
                                               mlm_probability=cfg.bench.plain.mlm_probability)
    timed = None  # (steps in the budget, seconds a step), timed once: no lr changes it
    plain_way = _PlainWay(cfg.bench.plain, cfg.model, cfg.seed, cfg.mixed_precision,
                          cfg.budget.minutes, cfg.heldout, cfg.model_card, cfg.corpus,
                          cfg.pretraining.max_seq_length)
    for name, learning_rate in arm_order(cfg.bench):
        if name in result["arms"]:
            logger.info("bench_pretrain_quality: %s was done earlier, kept", name)
            continue
        if learning_rate is None:
            result["arms"][name] = _bertkit_arm(cfg, run_dir / "bertkit")
        else:
            work_dir = run_dir / arm_directory(name)
            if timed is None:
                timed = steps_in_budget(plain_way, blocks, tokenizer, collator, budget_seconds,
                                        work_dir)
            steps, per_step = timed
            logger.info("%s: %.3f s a step, %d steps in %.0f s", name, per_step, steps,
                        budget_seconds)
            arm = _plain_arm(plain_way, tokenizer, collator, heldout, blocks, learning_rate, steps,
                             work_dir)
            result["arms"][name] = {**arm, "seconds_per_step_timed": per_step}
        result["summary"] = _summary(result)
        write_json_atomic(path, result)  # each arm as soon as it ends
    plot_curves({name: arm["curve"] for name, arm in result["arms"].items()},
                run_dir / FIGURE_FILE,
                f"held-out MLM loss, {cfg.budget.minutes:g}-minute budget ({cfg.corpus.name})")
    print(table(result))
    return result


# What `python -m benchmarks.pretrain_quality` runs: its job on its primary config,
# benchmarks/conf/bench_pretrain_quality.yaml.
CONFIG = "bench_pretrain_quality"
JOB = Job("benchmarks.pretrain_quality:benchmark_pretrain_quality", RESULT_FILE,
          reuses_its_runs=True)

if __name__ == "__main__":
    main(JOB, CONFIG)
