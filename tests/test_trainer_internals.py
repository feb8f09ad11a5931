"""What the trainer internals (bertkit.training.trainer) and bertkit's sampler overrides rely on
in the installed transformers.Trainer. Each test fails, naming the assumption, on a release that
changed it."""

from __future__ import annotations

import copy
import inspect

import datasets
import pytest
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from bertkit.training.trainer import (
    BertkitTrainer,
    EpochSeededLengthGroupedSampler,
    callbacks_of,
    put_first,
    replace_model,
    use_optimizer,
)
from tests.finetuning.method_fixtures import RandomPairs, tiny_classifier


def arguments(tmp_path, **extra) -> TrainingArguments:
    options = {"max_steps": 4, "per_device_train_batch_size": 8, "learning_rate": 1e-3,
               "logging_steps": 1, "report_to": [], "save_strategy": "no", "use_cpu": True,
               "seed": 0, "disable_tqdm": True, "lr_scheduler_type": "linear", **extra}
    return TrainingArguments(output_dir=str(tmp_path / "out"), **options)


class Reporter(TrainerCallback):
    """Stands in for W&B's callback: what each training log line held when it was reported."""

    def __init__(self):
        self.lines = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.lines.append(dict(logs or {}))


class AddsKey(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None:
            logs["added"] = 1.0


def test_a_callback_put_first_runs_before_the_ones_trainer_was_given(tmp_path):
    reporter = Reporter()
    trainer = Trainer(model=tiny_classifier(), args=arguments(tmp_path),
                      train_dataset=RandomPairs(), callbacks=[reporter])
    adds = AddsKey()

    put_first(trainer, adds)
    trainer.train()

    assert callbacks_of(trainer)[0] is adds
    training_lines = [line for line in reporter.lines if "loss" in line]
    assert len(training_lines) == 4, "Trainer no longer calls on_log once per logging step"
    assert all(line.get("added") == 1.0 for line in training_lines), (
        "a callback put first no longer edits the logs before the other callbacks see them")


def test_an_optimizer_set_before_training_is_the_one_that_steps_and_is_scheduled(tmp_path):
    model = tiny_classifier()
    trainer = Trainer(model=model, args=arguments(tmp_path, warmup_steps=0),
                      train_dataset=RandomPairs())
    optimizer = torch.optim.SGD([{"params": [p for n, p in model.named_parameters()
                                             if n.startswith("classifier.")], "lr": 0.5}],
                                lr=0.5)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}

    use_optimizer(trainer, optimizer)
    trainer.train()

    # accelerate wraps it (AcceleratedOptimizer); the optimizer inside is the one given.
    assert getattr(trainer.optimizer, "optimizer", trainer.optimizer) is optimizer, (
        "Trainer replaced an optimizer set before train()")
    moved = {n for n, p in model.named_parameters() if not p.detach().equal(before[n])}
    assert moved == {"classifier.weight", "classifier.bias"}
    # Linear decay over 4 steps: the group's own rate ends at 0.5 * (4 - 4) / 4 = 0.
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-12), (
        "Trainer's scheduler no longer drives the groups of an optimizer set before train()")


def test_a_model_replaced_after_training_is_the_one_evaluated(tmp_path):
    trainer = Trainer(model=tiny_classifier(), args=arguments(tmp_path),
                      train_dataset=RandomPairs(), eval_dataset=RandomPairs(n=16, seed=1))
    trainer.train()
    replacement = copy.deepcopy(trainer.model).eval()
    with torch.no_grad():
        replacement.classifier.weight.zero_()
        replacement.classifier.bias.copy_(torch.tensor([2.0, -1.0]))
    data = RandomPairs(n=16, seed=1)
    expected = torch.nn.functional.cross_entropy(
        torch.tensor([[2.0, -1.0]]).expand(16, 2), data.labels).item()

    replace_model(trainer, replacement)
    scores = trainer.evaluate()

    assert scores["eval_loss"] == pytest.approx(expected, rel=1e-5), (
        "evaluate() no longer uses trainer.model / model_wrapped as set after training")


def test_the_private_sampler_hooks_bertkit_overrides_are_still_called(tmp_path):
    """BertkitTrainer and PretrainingTrainer override _get_train_sampler and
    _get_eval_sampler: Trainer must still call them, with these signatures."""
    assert list(inspect.signature(Trainer._get_train_sampler).parameters) == [
        "self", "train_dataset"], "Trainer._get_train_sampler changed its signature"
    assert list(inspect.signature(Trainer._get_eval_sampler).parameters) == [
        "self", "eval_dataset"], "Trainer._get_eval_sampler changed its signature"
    data = RandomPairs()
    train = [{**data[i], "length": int(i % 5) + 1} for i in range(len(data))]
    calls = []

    class Spy(BertkitTrainer):
        def _get_train_sampler(self, train_dataset=None):
            sampler = super()._get_train_sampler(train_dataset)
            calls.append(("train", sampler))
            return sampler

        def _get_eval_sampler(self, eval_dataset):
            calls.append(("eval", super()._get_eval_sampler(eval_dataset)))
            return calls[-1][1]

    dataset = datasets.Dataset.from_list([{k: (v.tolist() if hasattr(v, "tolist") else v)
                                           for k, v in row.items()} for row in train])
    trainer = Spy(model=tiny_classifier(), train_dataset=dataset, eval_dataset=dataset,
                  args=arguments(tmp_path, train_sampling_strategy="group_by_length"))
    trainer.get_train_dataloader()
    trainer.get_eval_dataloader()

    kinds = {kind: sampler for kind, sampler in calls}
    assert set(kinds) == {"train", "eval"}, "Trainer no longer calls bertkit's sampler hooks"
    assert isinstance(kinds["train"], EpochSeededLengthGroupedSampler)
    assert isinstance(kinds["eval"], torch.utils.data.SequentialSampler)


class SavesAtStepTwo(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            control.should_save = True


def test_a_callback_put_last_sees_what_later_added_ones_decided(tmp_path):
    """The lean step's flush (bertkit.training.trainer) runs last at a step's end, so that
    a save another callback asked for finds the device counters in the state it saves."""
    from bertkit.training.trainer import put_last

    seen = []

    class Last(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            seen.append((state.global_step, control.should_save))

    trainer = Trainer(model=tiny_classifier(), args=arguments(tmp_path),
                      train_dataset=RandomPairs())
    last = Last()
    trainer.add_callback(last)
    trainer.add_callback(SavesAtStepTwo())  # added after: would run after `last`
    put_last(trainer, last)
    trainer.train()
    assert callbacks_of(trainer)[-1] is last
    assert (2, True) in seen


def test_trainer_reads_the_flags_the_lean_step_turns_off_from_its_arguments(tmp_path):
    """The lean step takes Trainer's per-step NaN/Inf check and tokens-seen count off by
    setting these two arguments on the trainer's own args; Trainer must still read them there
    (a release that cached them at construction would sync again, and the sync test fail)."""
    source = inspect.getsource(Trainer)
    assert "self.args.logging_nan_inf_filter" in source
    assert "self.args.include_num_input_tokens_seen" in source


def test_trainer_tells_missing_keys_after_every_checkpoint_load_through_one_hook():
    """BertkitTrainer._issue_warnings_after_load drops the tied weights from the missing keys
    of a resume (tests/training/test_interrupts.py): Trainer must still route each load of a
    checkpoint's weights (whole or sharded, and the best model's) through that hook, with a
    result that has missing_keys."""
    assert "_issue_warnings_after_load" in vars(Trainer)
    for method in (Trainer._load_from_checkpoint, Trainer._load_best_model):
        assert "self._issue_warnings_after_load(load_result)" in inspect.getsource(method)
    assert "load_result.missing_keys" in inspect.getsource(Trainer._issue_warnings_after_load)
