"""Pretraining BertForPreTraining from raw documents with Trainer, read top-down in `pretrain`:
the settings checked, the data built (bertkit.pretraining.training_data), PretrainingTrainer
trained through the steps every job shares (bertkit.training.run), metrics.json written, then
the downstream finetunes.

A share of the documents is held out first (heldout.fraction; bertkit/pretraining/heldout.py):
the vocabulary and the training data come from the rest, and the model is scored during
training on held-out masked positions that are the same for every arm of a comparison.

Leaves in the run directory: config.yaml, metrics.json, and model/ (weights and tokenizer),
which the GLUE recipe finetunes with model.name_or_path=<run dir>/model.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from omegaconf import DictConfig
from transformers import TrainingArguments

from bertkit.config_schema import check_ranges
from bertkit.data.atomic_files import write_json_atomic
from bertkit.data.fingerprints import model_input_fingerprints
from bertkit.data.hub import known_offline
from bertkit.data.metrics_file import (
    INPUT_FINGERPRINTS,
    LIMITED_SAMPLES,
    METRICS_FILE,
    cut,
    cut_line,
    describe_cut,
)
from bertkit.errors import BertkitError
from bertkit.pretraining.corpora import corpus_input_fingerprints
from bertkit.pretraining.downstream import (
    DownstreamSettings,
    check_downstream,
    downstream_settings,
    finetune_downstream,
)
from bertkit.pretraining.heldout import (
    check_heldout_config,
    heldout_enabled,
    heldout_settings,
)
from bertkit.pretraining.heldout_evaluation import HeldoutEvaluation, heldout_record
from bertkit.pretraining.model import load_pretraining_model, use_padding_free_attention
from bertkit.pretraining.objective import objective_of
from bertkit.pretraining.trainer import PretrainingTrainer
from bertkit.pretraining.training_data import (
    DataSettings,
    PretrainingData,
    data_settings,
    is_streaming,
    phase_settings,
    prepare_pretraining_data,
)
from bertkit.secret_masking import mask_secrets
from bertkit.training.budget import TrainingClock
from bertkit.training.model_card import run_card, write_card
from bertkit.training.models import check_model_settings, tokenizer_size
from bertkit.training.run import (
    Outcome,
    RunSetup,
    TrainingRun,
    publish,
    push_if_asked,
    saving_model,
    start_run,
    train_run,
)
from bertkit.training.static_shapes import prepare_compile
from bertkit.training.wandb_logging import paper_hyperparameters

logger = logging.getLogger(__name__)

# The choices of masking.kind (bertkit.config_schema reads them).
MASKING_KINDS = ("static", "dynamic")


def check_pretraining_config(cfg: DictConfig) -> None:
    """Contradictory settings fail here, before any data is read: each value's type and range
    first (the schema, bertkit.config_schema), then the rules between settings."""
    check_ranges(cfg)
    objective = objective_of(cfg.objective)  # a registered objective, its keys its own
    # -1 (train by epochs) is a valid trainer.max_steps elsewhere, not for pretraining.
    if cfg.trainer.max_steps is None or cfg.trainer.max_steps <= 0:
        raise BertkitError("trainer.max_steps: pretraining is measured in optimizer steps "
                           "(the paper: 1,000,000); give a positive number")
    long_phase = cfg.pretraining.long_phase
    lengths = {"pretraining.max_seq_length": cfg.pretraining.max_seq_length}
    if long_phase.fraction > 0:
        lengths["pretraining.long_phase.max_seq_length"] = long_phase.max_seq_length
    # A vocabulary trained by the run is not there yet: load_pretraining_model checks it.
    check_model_settings(
        cfg.model, lengths,
        f"objective.name={objective.name} ({objective.title})" if objective.second_segment
        else None, None if cfg.tokenizer_training.enabled else tokenizer_size(cfg.model))
    if long_phase.fraction > 0 and long_phase.max_seq_length <= cfg.pretraining.max_seq_length:
        raise BertkitError(f"pretraining.max_seq_length={cfg.pretraining.max_seq_length} is not "
                           f"below pretraining.long_phase.max_seq_length="
                           f"{long_phase.max_seq_length} (the last "
                           f"pretraining.long_phase.fraction={long_phase.fraction} of the steps): "
                           f"lower it, raise the long phase's, or set "
                           f"pretraining.long_phase.fraction=0")
    # the GLUE finetunes after it, against the same model.config
    check_downstream(downstream_settings(cfg))
    check_heldout_config(heldout_settings(cfg))
    if is_streaming(cfg.corpus):
        if cfg.masking.kind == "static":
            raise BertkitError("masking=static with corpus.hub.streaming=true: static masks are "
                               "computed once and stored, which a stream cannot do; use "
                               "masking=dynamic, or corpus.hub.streaming=false")
        if long_phase.fraction > 0:
            raise BertkitError("pretraining.long_phase.fraction>0 with corpus.hub.streaming=true: "
                               "the 512-token phase needs its own stored instances; set "
                               "pretraining.long_phase.fraction=0 or corpus.hub.streaming=false")
        if cfg.pretraining.padding_free is True:
            raise BertkitError("pretraining.padding_free=true with corpus.hub.streaming=true: "
                               "padding-free batches are drawn from the stored instances of "
                               "each phase, which a stream does not have; set "
                               "pretraining.padding_free=auto or false, or "
                               "corpus.hub.streaming=false")
        if heldout_enabled(heldout_settings(cfg)):
            raise BertkitError("heldout.fraction>0 with corpus.hub.streaming=true: the held-out "
                               "documents are chosen from the stored corpus before training, "
                               "which a stream cannot do; set heldout.fraction=0 or "
                               "corpus.hub.streaming=false")


def pretraining_hyperparameters(pretraining: DictConfig, masking: DictConfig,
                                objective: DictConfig, corpus: DictConfig,
                                args: TrainingArguments, model) -> dict:
    """The paper's names plus what defines a pretraining run, for W&B and metrics.json."""
    long_phase = pretraining.long_phase
    return {
        **paper_hyperparameters(args, model, pretraining.max_seq_length),
        "objective": objective.name,
        "masking": masking.kind,
        "dupe_factor": masking.dupe_factor if masking.kind == "static" else None,
        "mlm_probability": masking.mlm_probability,
        "mask_token_fraction": masking.mask_token_fraction,
        "random_token_fraction": masking.random_token_fraction,
        "max_predictions_per_seq": masking.max_predictions_per_seq,
        "masking_unit": masking.unit,
        "masking_convention": masking.convention,
        "short_seq_prob": pretraining.short_seq_prob,
        "long_phase_fraction": long_phase.fraction,
        "long_phase_max_seq_length": long_phase.max_seq_length if long_phase.fraction else None,
        "corpus": corpus.name,
        "vocab_size": model.vocab_rows,  # as saved: without the padding rows
        "pad_vocab_to_multiple_of": pretraining.pad_vocab_to_multiple_of,
    }


def _heldout_line(heldout: dict | None, sentence_task: str | None) -> str:
    """The printout's held-out scores (at the last evaluation), or nothing when off."""
    final = (heldout or {}).get("final")
    if not final:
        return ""
    line = (f"  held-out ({heldout['sequences']} sequences, {heldout['masked_positions']} masked "
            f"positions): MLM loss {final['mlm_loss']:.4f}, MLM accuracy "
            f"{final['mlm_accuracy']:.4f}")
    if sentence_task and f"{sentence_task}_accuracy" in final:
        line += f", {sentence_task.upper()} accuracy {final[f'{sentence_task}_accuracy']:.4f}"
    return line + "\n"


def _window_words(window: tuple[int, int] | None) -> str:
    """Which steps the printed training scores are the mean of (the last log line's)."""
    if window is None:
        return "(no training step logged)"
    first, last = window
    return f"(step {last})" if first == last else f"(mean over steps {first}-{last})"


def _training_lines(history: list[dict]) -> list[dict]:
    return [dict(line) for line in history if "mlm_loss" in line]


def pretrain(cfg: DictConfig, run_dir: Path | None = None) -> dict:
    """Pretrains from cfg.corpus; returns the metrics.json record (with the downstream
    finetunes' scores when downstream.tasks is set)."""
    check_pretraining_config(cfg)
    job = data_settings(cfg)
    setup = start_run(cfg, run_dir)
    data, inputs = prepare_data(job, setup)
    trainer, hyperparameters = build_pretraining_trainer(job, setup.args, data)
    limited = pretraining_cuts(job.corpus, data)
    run = train_run(cfg, setup, trainer, hyperparameters,
                    heldout_callbacks(job.heldout, trainer, data, setup.clock), limited)
    save_model(trainer, setup.run_dir, run.main)
    outcome = _outcome(cfg.recipe.name, job, trainer, data, run, setup.run_dir, inputs,
                       limited)
    publish(setup, run, outcome)
    record = _downstream(downstream_settings(cfg), setup.cfg, outcome.record, setup.run_dir,
                         run.main)
    push_if_asked(setup, trainer, record)
    return record


def prepare_data(job: DataSettings, setup: RunSetup) -> tuple[PretrainingData, dict]:
    """The vocabulary, instances and held-out sets (the main process first, the others read
    its cache), and what the run read by content: bertkit-report tells its downstream
    finetunes apart by these, not by the paths they were given (bertkit.reporting.identity).
    Compiled, the compile caches go under cache_dir first, shared with other runs."""
    if setup.args.torch_compile:
        prepare_compile(setup.cfg.cache_dir)
    with setup.args.main_process_first(desc="preparing the pretraining data"):
        data = prepare_pretraining_data(job, setup.args)
        inputs = {**model_input_fingerprints(job.model, data.tokenizer, job.cache_dir),
                  **corpus_input_fingerprints(job.corpus, job.cache_dir)}
    return data, inputs


def save_model(trainer: PretrainingTrainer, run_dir: Path, main: bool) -> None:
    """The trained model under run_dir/model (BertForPreTraining's files, without the
    vocabulary's padding rows)."""
    with saving_model(run_dir / "model", main):
        trainer.save_model(str(run_dir / "model"))


def build_pretraining_trainer(job: DataSettings, args: TrainingArguments,
                              data: PretrainingData) -> tuple[PretrainingTrainer, dict]:
    """(the trainer, the hyperparameters recorded in W&B and metrics.json); `job`: the
    pretraining job's nodes (training_data.data_settings)."""
    model = load_pretraining_model(job.model, data.tokenizer,
                                   job.pretraining.pad_vocab_to_multiple_of)
    if data.packing is not None:
        use_padding_free_attention(model)
    trainer = PretrainingTrainer(
        model=model, args=args, train_dataset=data.train_dataset,
        data_collator=data.collator, processing_class=data.tokenizer,
        phases=data.phases, sentence_task=objective_of(job.objective).sentence_task,
        group_by_length=data.group_by_length, packing=data.packing)
    return trainer, pretraining_hyperparameters(job.pretraining, job.masking, job.objective,
                                                job.corpus, args, model)


def heldout_callbacks(settings: DictConfig, trainer, data: PretrainingData,
                      clock: TrainingClock) -> list:
    """The held-out evaluation, on the run's training clock (paused while it scores);
    settings: the heldout node (heldout_settings')."""
    if data.heldout is None:
        return []
    return [HeldoutEvaluation(trainer, data.heldout, clock, batch_size=settings.batch_size,
                              every_seconds=settings.every_seconds,
                              every_steps=settings.every_steps)]


def pretraining_cuts(corpus: DictConfig, data: PretrainingData) -> dict[str, dict]:
    """The parts of the data a pretraining run cut (bertkit.data.metrics_file): the corpus,
    when reading stopped at corpus.max_documents (the documents read; the whole is not
    counted). A corpus with fewer documents was read whole: no cut. heldout.max_sequences is
    not a cut: it is the size of the held-out sample every arm is scored on (512 by
    default), a setting that splits the report's rows like any other."""
    limit = corpus.get("max_documents")
    if limit is None:
        return {}
    read = (limit if data.train_documents is None  # a stream stops at the limit
            else data.train_documents + (data.heldout.documents if data.heldout else 0))
    return {"corpus": cut(read, None)} if read >= limit else {}


def _outcome(recipe: str, job: DataSettings, trainer, data: PretrainingData, run: TrainingRun,
             run_dir: Path, inputs: dict[str, str], limited: dict[str, dict]) -> Outcome:
    lines = _training_lines(trainer.state.log_history)
    phases = data.phases
    record = {
        "recipe": recipe,
        "family": "pretraining",
        "corpus": job.corpus.name,
        "objective": job.objective.name,
        "masking": job.masking.kind,
        "seed": trainer.args.seed,
        # The share of the positions fed in training that were padding (across resumes).
        "padding_fraction": trainer.padding_fraction,
        "padding_free": data.packing is not None,
        "first_log": lines[0] if lines else {},
        "last_log": lines[-1] if lines else {},
        "train": run.train_record(tokens_seen=trainer.state.num_input_tokens_seen),
        "data": {
            "instances": None if phases is None else [
                {"max_seq_length": length, "instances": len(phase.lengths),
                 "mean_length": float(np.mean(phase.lengths)) if len(phase.lengths) else 0.0,
                 "samples": phase.num_samples}
                for (length, _, _), phase in zip(phase_settings(job.pretraining, job.masking),
                                                 phases, strict=False)],
            "preprocessing_seconds": round(data.seconds, 2),
        },
        "hyperparameters": run.hyperparameters,
        "heldout": None if data.heldout is None else heldout_record(
            data.heldout, data.train_documents, trainer.state.log_history,
            job.heldout),
        "log": lines,  # every training log line, for curves without W&B
        "details": {INPUT_FINGERPRINTS: inputs,
                    **({LIMITED_SAMPLES: limited} if limited else {})},
    }
    last = record["last_log"]
    heldout_final = (record["heldout"] or {}).get("final") or {}

    window = trainer.last_logging_window

    def printout(where: str) -> str:
        sentence = objective_of(job.objective).sentence_task
        scores = f"MLM loss {last.get('mlm_loss', float('nan')):.4f}, MLM accuracy " \
                 f"{last.get('mlm_accuracy', float('nan')):.4f}"
        if sentence:
            scores += (f", {sentence.upper()} accuracy "
                       f"{last.get(f'{sentence}_accuracy', 0.0):.4f}")
        model_dir = run_dir / "model"
        return (f"\npretraining on {job.corpus.name}: {scores} "
                f"{_window_words(window)}, after {run.output.global_step} steps\n"
                f"{_heldout_line(record['heldout'], sentence)}"
                f"{cut_line(limited, job.corpus.name)}"
                f"  metrics:  {run_dir / METRICS_FILE}\n"
                f"  model:    {model_dir}\n"
                f"  finetune: bertkit recipe=glue task=mrpc model.name_or_path={model_dir}"
                # without the Hub, MRPC's files are needed (bertkit.data.hub)
                + (" task.data_dir=<MRPC's files>" if known_offline() else ""))

    final = {**last, **{f"heldout/{key}": value for key, value in heldout_final.items()
                        if key != "step"}}
    return Outcome(record, final, None, printout)


def _downstream(settings: DownstreamSettings, card: DictConfig, record: dict, run_dir: Path,
                main: bool) -> dict:
    """The downstream finetunes, once the pretraining W&B run is closed (they open their
    own), on every process (a finetune under torchrun needs all of them); their scores go
    into metrics.json and the model's card."""
    if not settings.downstream.tasks:
        return record
    downstream = finetune_downstream(settings, run_dir / "model", run_dir)
    if not main:
        return record
    record = {**record, "downstream": downstream}
    write_json_atomic(run_dir / METRICS_FILE, mask_secrets(record))
    write_card(run_card(card, record), run_dir / "model")
    for task, result in downstream.items():
        cuts = result.get(LIMITED_SAMPLES) or {}
        print(f"  {task}: {result['main_metric']} = {result['main_value']:.4f}"
              + (f" (part of the data only: "
                 f"{'; '.join(describe_cut(part, entry) for part, entry in cuts.items())})"
                 if cuts else ""))
    return record
