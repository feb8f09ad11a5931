"""The finetunes of a grid that share their shapes, trained as one model through Trainer.

A ModelArray holds the members' parameters stacked (torch.func.stack_module_state: one
[members, ...] tensor per parameter) and runs the task's own Hugging Face model under
`vmap` over them (functional_call on a template of the model on the meta device): one
forward and one backward for every member, where one job per member would launch each of
their kernels once per member (HFTA, Wang et al., MLSys 2021).

Each member stays the run it would be alone:

- its model is built by its own job (its seed: the head's initialisation), its batches come
  from its own trainer's dataloader (its seed: the data order);
- its optimizer and scheduler are the ones its own trainer builds (its learning rate, weight
  decay, any lr_scheduler_type and warmup, the layer-wise rates of finetuning.layer_lr_decay),
  stepping its slice of the stacked parameters with torch's own (fused) kernel
  (MemberOptimizers): one optimizer step per member, the update of its run alone;
- its gradients are clipped at its max_grad_norm by torch's clip_grad_norm_ over its slice;
- its losses are logged into its own history, its evaluations run on its own model.

The loss Trainer backpropagates is the sum of the members' losses: each member's parameters
see the gradient of its own loss only, so a member whose loss turns NaN spoils only its own
slice (the others go on); it is reported failed at that step (ArrayTrainer.failed_at).
"""

from __future__ import annotations

import copy
import inspect
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap
from transformers import Trainer, TrainingArguments, set_seed
from transformers.integrations.integration_utils import WandbCallback
from transformers.trainer_utils import TrainOutput
from transformers.utils import ModelOutput

from bertkit.training.throughput import GIB, peak_memory_bytes

# A "." may not name a module's parameter; a stacked parameter is named by its path in the
# member's model with this in place of each dot.
SEPARATOR = "/"


@dataclass
class ArrayOutput(ModelOutput):
    """The members' losses, [members] (Trainer reads `loss`: their sum, see ArrayTrainer)."""

    loss: torch.Tensor | None = None
    losses: torch.Tensor | None = None


class ModelArray(nn.Module):
    """The members' models as one module: trained parameters stacked as parameters, frozen
    ones and buffers stacked as buffers, and the first member's model, on the meta device, as
    the template every member's forward runs through."""

    def __init__(self, members: Sequence[nn.Module]):
        super().__init__()
        if len({type(member) for member in members}) != 1:
            raise ValueError("the members of a model array are models of one class")
        self.size = len(members)
        params, buffers = stack_module_state(list(members))
        trained = {name for name, p in members[0].named_parameters() if p.requires_grad}
        self.stacked = nn.ParameterDict({
            name.replace(".", SEPARATOR): nn.Parameter(value.detach(), requires_grad=True)
            for name, value in params.items() if name in trained})
        self._constants = [name for name in params if name not in trained] + list(buffers)
        for name in self._constants:
            value = params[name] if name in params else buffers[name]
            self.register_buffer(_buffer_name(name), value.detach().clone())
        # Each embedding's padding row (a trained one), whose gradient is zeroed after backward.
        self.padding_rows = [
            (f"{name}.weight".replace(".", SEPARATOR), module.padding_idx)
            for name, module in members[0].named_modules()
            if isinstance(module, nn.Embedding) and module.padding_idx is not None
            and f"{name}.weight" in trained]
        self.alive: torch.Tensor | None = None  # per member: still training (ArrayTrainer)
        # Not a submodule: Trainer's .to(device) and state_dict must not see it.
        object.__setattr__(self, "template", copy.deepcopy(members[0]).to("meta"))
        self.config = members[0].config  # Trainer reads the model's config

    def train(self, mode: bool = True):
        super().train(mode)
        self.template.train(mode)
        return self

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every stacked tensor by its name in the member's model."""
        named = {name.replace(SEPARATOR, "."): p for name, p in self.stacked.items()}
        named.update({name: getattr(self, _buffer_name(name)) for name in self._constants})
        return named

    def forward(self, **inputs) -> ArrayOutput:
        """inputs: each member's batch stacked, [members, batch, ...] (ZippedBatches)."""

        def member_loss(tensors, batch):
            return functional_call(self.template, tensors, (), batch).loss

        losses = vmap(member_loss, randomness="different")(self.tensors(), inputs)
        return ArrayOutput(loss=losses.sum(), losses=losses)

    @torch.no_grad()
    def zero_padding_gradients(self) -> None:
        """nn.Embedding gives its padding row no gradient (torch's embedding backward skips
        padding_idx); vmap's batching rule of that backward does not skip it, so the row is
        zeroed here, or the [PAD] embedding of a member would train where alone it does not
        (it moves every loss that reads padded positions: SQuAD's span softmax does)."""
        for name, row in self.padding_rows:
            grad = self.stacked[name].grad
            if grad is not None:
                grad[:, row] = 0

    @torch.no_grad()
    def zero_failed_gradients(self) -> None:
        """The gradients of the members that are out (`alive` false: a loss that was not
        finite) zeroed, so that their optimizers leave their slices as they were (decay
        aside) and no NaN enters their parameters."""
        if self.alive is None:
            return
        for parameter in self.stacked.values():
            if parameter.grad is not None:
                keep = self.alive.view(-1, *([1] * (parameter.dim() - 1)))
                parameter.grad.copy_(torch.where(keep, parameter.grad, 0.0))

    @torch.no_grad()
    def copy_member_into(self, index: int, model: nn.Module) -> None:
        """Member `index`'s parameters and buffers into `model` (a model of the template's
        class and shapes: that member's own)."""
        tensors = self.tensors()
        for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
            if name in tensors:
                tensor.copy_(tensors[name][index].to(tensor.device))

    def member_state(self, index: int) -> dict[str, torch.Tensor]:
        """A copy of member `index`'s tensors on the CPU (a best model kept aside)."""
        return {name: tensor[index].detach().to("cpu", copy=True)
                for name, tensor in self.tensors().items()}

    @torch.no_grad()
    def load_member_state(self, index: int, state: dict[str, torch.Tensor]) -> None:
        for name, tensor in self.tensors().items():
            tensor[index].copy_(state[name].to(tensor.device))


def _buffer_name(name: str) -> str:
    return "constant__" + name.replace(".", "__")


# ================================================================================================
# The members' batches as one: each member's own dataloader, in step.

class ZippedBatches:
    """One batch per member per step, stacked: each key padded along its last dimension to the
    widest member's (a padded key weighs nothing: attention mask 0, label -100), a member's
    batch without an attention mask (bertkit drops all-ones masks) given one of ones."""

    def __init__(self, loaders: Sequence, pad_token_id: int):
        self.loaders = list(loaders)
        self.pad_token_id = pad_token_id

    def __len__(self) -> int:
        return len(self.loaders[0])

    def set_epoch(self, epoch: int) -> None:
        for loader in self.loaders:
            if hasattr(loader, "set_epoch"):
                loader.set_epoch(epoch)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for batches in zip(*self.loaders, strict=True):
            yield stack_batches(list(batches), self.pad_token_id)


PAD_VALUES = {"labels": -100, "attention_mask": 0, "token_type_ids": 0}


def stack_batches(batches: list[dict], pad_token_id: int) -> dict[str, torch.Tensor]:
    keys = dict.fromkeys(key for batch in batches for key in batch)
    if "attention_mask" in keys:
        for batch in batches:
            if "attention_mask" not in batch:
                batch["attention_mask"] = torch.ones_like(batch["input_ids"])
    stacked = {}
    for key in keys:
        tensors = [batch[key] for batch in batches]
        width = max(tensor.shape[-1] for tensor in tensors) if tensors[0].dim() else None
        if width is not None and any(tensor.shape[-1] != width for tensor in tensors):
            pad = PAD_VALUES.get(key, pad_token_id if key == "input_ids" else 0)
            tensors = [nn.functional.pad(tensor, (0, width - tensor.shape[-1]), value=pad)
                       for tensor in tensors]
        stacked[key] = torch.stack(tensors)
    return stacked


# ================================================================================================
# The members' optimizers and schedules applied to the stacked parameters.

class MemberOptimizers(torch.optim.Optimizer):
    """Each member's own optimizer (the one its trainer built: its class, its groups, their
    rates and decay, fused or foreach as it was made) stepping that member's slice of the
    stacked parameters, after torch.nn.utils.clip_grad_norm_ clipped that slice's gradients
    at the member's max_grad_norm. So each member's update is the very kernel, with the very
    scalars, of its run alone; the members' optimizers hold their own states.

    Trainer sees one optimizer over the stacked parameters (its zero_grad, its state)."""

    def __init__(self, array: ModelArray, member_models: Sequence[nn.Module],
                 member_optimizers: Sequence[torch.optim.Optimizer],
                 max_grad_norms: Sequence[float]):
        super().__init__(list(array.stacked.values()), {})
        self.array = array
        self.max_grad_norms = [float(norm) for norm in max_grad_norms]
        self.grad_norms: list[torch.Tensor | None] = [None] * array.size
        self.optimizers: list[torch.optim.Optimizer] = []
        self.sliced: list[list[tuple[torch.Tensor, nn.Parameter]]] = []  # (slice, stacked)
        for index, (model, optimizer) in enumerate(zip(member_models, member_optimizers,
                                                       strict=True)):
            names = {id(p): name for name, p in model.named_parameters()}
            groups, pairs = [], []
            for group in optimizer.param_groups:
                slices = []
                for parameter in group["params"]:
                    stacked = array.stacked[names[id(parameter)].replace(".", SEPARATOR)]
                    slices.append(stacked.data[index])  # a view: updated in place
                    pairs.append((slices[-1], stacked))
                groups.append({**{k: v for k, v in group.items() if k != "params"},
                               "params": slices})
            self.optimizers.append(_same_kind(optimizer, groups))
            self.sliced.append(pairs)

    @torch.no_grad()
    def step(self, closure=None):
        self.array.zero_padding_gradients()
        self.array.zero_failed_gradients()
        for index, optimizer in enumerate(self.optimizers):
            grads = []
            for view, stacked in self.sliced[index]:
                view.grad = None if stacked.grad is None else stacked.grad[index]
                if view.grad is not None:
                    grads.append(view)
            if self.max_grad_norms[index] > 0 and grads:
                self.grad_norms[index] = torch.nn.utils.clip_grad_norm_(
                    grads, self.max_grad_norms[index])
            optimizer.step()
            for view, _ in self.sliced[index]:
                view.grad = None


def _same_kind(optimizer: torch.optim.Optimizer, groups: list[dict]) -> torch.optim.Optimizer:
    """An optimizer of optimizer's class and defaults over `groups` (the defaults its
    constructor takes: torch's AdamW keeps Adam's decoupled_weight_decay among them)."""
    accepted = inspect.signature(type(optimizer).__init__).parameters
    return type(optimizer)(groups, **{key: value for key, value in optimizer.defaults.items()
                                      if key in accepted})


class MemberSchedules(torch.optim.lr_scheduler.LRScheduler):
    """Each member's own scheduler (Trainer's, over the member's own optimizer in
    MemberOptimizers), stepped together; Trainer's log line shows the first member's rate."""

    def __init__(self, schedulers: Sequence, optimizer: MemberOptimizers):
        self.schedulers = list(schedulers)
        self.optimizer = optimizer
        self.last_epoch = 0

    def step(self, epoch=None):
        for scheduler in self.schedulers:
            scheduler.step()
        self.last_epoch += 1

    def get_last_lr(self) -> list[float]:
        return self.schedulers[0].get_last_lr()

    def member_rates(self) -> list[float]:
        return [scheduler.get_last_lr()[0] for scheduler in self.schedulers]

    def state_dict(self) -> dict:
        return {"schedulers": [s.state_dict() for s in self.schedulers],
                "last_epoch": self.last_epoch}

    def load_state_dict(self, state_dict: dict) -> None:
        for scheduler, state in zip(self.schedulers, state_dict["schedulers"], strict=True):
            scheduler.load_state_dict(state)
        self.last_epoch = state_dict["last_epoch"]


# ================================================================================================
# The array trained through Trainer: its loop, its accelerator, its logging and evaluation
# schedule; the members' dataloaders, optimizers and schedulers, each built by its own trainer.

class ArrayTrainer(Trainer):
    """Trainer over a ModelArray whose members are `members` (each member's own trainer,
    which built its model, dataloader, optimizer and scheduler as it would have alone).

    Its hooks: get_train_dataloader zips the members' loaders; compute_loss returns the sum of
    the members' losses and keeps each one's for its own log; create_optimizer and
    create_scheduler wrap the members' own; log writes each member's line into its own
    history; evaluate evaluates each member on its own model (keeping its best weights where
    its arguments ask for the best model at the end)."""

    def __init__(self, array: ModelArray, members: Sequence[Trainer], args: TrainingArguments,
                 pad_token_id: int):
        super().__init__(model=array, args=args, eval_dataset=members[0].eval_dataset)
        # The members' losses are means over their batches: Trainer averages them over
        # gradient accumulation itself (as it does a bertkit finetune's).
        self.model_accepts_loss_kwargs = False
        self.array = array
        self.members = list(members)
        self.pad_token_id = pad_token_id
        self.array_optimizer: MemberOptimizers | None = None
        self.failed_at: torch.Tensor | None = None  # per member: the first non-finite step
        self._window: torch.Tensor | None = None  # the members' summed losses since the last log
        self._window_steps = 0
        self._total: torch.Tensor | None = None  # the members' summed losses of the whole run
        self.best_states: dict[int, dict[str, torch.Tensor]] = {}
        self.last_evaluated = -1

    def get_train_dataloader(self):
        loaders = []
        for member in self.members:
            set_seed(member.args.seed)  # its data order: its sampler takes the seed now
            loaders.append(member.get_train_dataloader())
        set_seed(self.members[0].args.seed)
        return ZippedBatches(loaders, self.pad_token_id)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs)
        losses = outputs.losses.detach().float()
        step = self.state.global_step + 1
        if self.failed_at is None:
            self.failed_at = torch.zeros(len(losses), dtype=torch.long, device=losses.device)
        # The first step whose loss is not finite, kept on the device (no sync per step); from
        # then on that member is out: its loss adds nothing to the sum (a NaN upstream gradient
        # reached the other members' embeddings through vmap's backward, seen in a GLUE run)
        # and MemberOptimizers leaves its slice as it was.
        finite = torch.isfinite(outputs.losses)
        self.failed_at = torch.where((self.failed_at == 0) & ~finite, step, self.failed_at)
        self.array.alive = self.failed_at == 0
        loss = torch.where(self.array.alive, outputs.losses, 0.0).sum()
        outputs = ArrayOutput(loss=loss, losses=outputs.losses)
        self._window = losses if self._window is None else self._window + losses
        self._total = losses if self._total is None else self._total + losses
        self._window_steps += 1
        return (outputs.loss, outputs) if return_outputs else outputs.loss

    def create_optimizer(self, model=None):
        if self.optimizer is None:
            optimizers = [member.create_optimizer() for member in self.members]
            self.array_optimizer = MemberOptimizers(
                self.array, [m.model for m in self.members], optimizers,
                [m.args.max_grad_norm for m in self.members])
            self.optimizer = self.array_optimizer  # accelerate wraps it: array_optimizer reads it
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.lr_scheduler is None:
            schedulers = []
            for member, optimizer in zip(self.members, self.array_optimizer.optimizers,
                                         strict=True):
                member.lr_scheduler = None  # built over the member's sliced optimizer
                schedulers.append(member.create_scheduler(num_training_steps, optimizer))
            self.lr_scheduler = MemberSchedules(schedulers, self.array_optimizer)
        return self.lr_scheduler

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self._window is not None:  # a training line: each member's own
            means = (self._window / max(self._window_steps, 1)).tolist()
            norms = [None if norm is None else float(norm)
                     for norm in self.array_optimizer.grad_norms]
            rates = self.lr_scheduler.member_rates()
            for index, member in enumerate(self.members):
                entry = {"loss": means[index],
                         **({} if norms[index] is None else {"grad_norm": norms[index]}),
                         "learning_rate": rates[index], "epoch": self.state.epoch}
                member.state.log_history.append({**entry, "step": self.state.global_step})
            self._window, self._window_steps = None, 0
            logs = {**logs, "loss": sum(means) / len(means)}  # the array's line: their mean
        super().log(logs, start_time)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval"):
        """Each member evaluated on its own model; the array's own metrics are none."""
        if self.state.global_step == self.last_evaluated:
            return {}
        self.last_evaluated = self.state.global_step
        for index, member in enumerate(self.members):
            self.array.copy_member_into(index, member.model)
            member.state.global_step, member.state.epoch = self.state.global_step, self.state.epoch
            metrics = member.evaluate()
            self.keep_if_best(index, member, metrics)
        return {}

    def keep_if_best(self, index: int, member: Trainer, metrics: dict[str, float]) -> None:
        """The member's best weights so far, where its arguments load the best model at the
        end (by metric_for_best_model, as Trainer picks its best checkpoint)."""
        args = member.args
        if not args.load_best_model_at_end:
            return
        name = args.metric_for_best_model or "loss"
        value = metrics[name if name.startswith("eval_") else f"eval_{name}"]
        best = member.state.best_metric
        better = best is None or (value > best if args.greater_is_better else value < best)
        if better:
            member.state.best_metric = value
            member.state.best_global_step = self.state.global_step
            self.best_states[index] = self.array.member_state(index)

    def member_losses(self) -> list[float]:
        steps = max(self.state.global_step * self.args.gradient_accumulation_steps, 1)
        return (self._total / steps).tolist() if self._total is not None \
            else [float("nan")] * len(self.members)


@dataclass
class MemberResult:
    """What training did for one member: Trainer's TrainOutput of its own, the step its
    gradients turned non-finite (None: never)."""

    output: TrainOutput
    failed_at: int | None
    seconds: float
    epochs: float | None
    members: int  # in its array
    peak_memory_gb: float  # the array's process (its device's peak allocation on a GPU)


def array_arguments(args: TrainingArguments) -> TrainingArguments:
    """The array's arguments: the first member's (the members share every one but those
    the members' own optimizers and schedulers apply per member), with Trainer's clipping off
    (each member is clipped by its own norm), no checkpoints (the array trains in one
    process; a member's run keeps no checkpoint once finished), no tracker (each member's
    W&B run gets its own history), no compile (vmap over a compiled model is not what the
    members' runs measured) and its evaluations at the members' points."""
    array = copy.copy(args)
    array.max_grad_norm = 0.0
    array.save_strategy = "no"
    array.load_best_model_at_end = False
    array.metric_for_best_model = None  # each member picks its own best (keep_if_best)
    array.report_to = []
    array.torch_compile = False  # the members' own evaluations compile as they decided
    return array


def train_members(members: Sequence[Trainer], pad_token_id: int) -> list[MemberResult]:
    """Trains the members' models as one ModelArray and leaves each member's trained weights
    (its best, where it asks for the best model) in its own trainer's model, its state
    (steps, epoch, log history, best metric) in its own trainer's state."""
    for member in members:
        member.remove_callback(WandbCallback)  # its run logs its history once trained
    array = ModelArray([member.model for member in members])
    trainer = ArrayTrainer(array, members, array_arguments(members[0].args), pad_token_id)
    started = time.perf_counter()
    output = trainer.train()
    seconds = time.perf_counter() - started
    peak = peak_memory_bytes(trainer.args.device) / GIB
    failed = {index: step for index, step in enumerate(
        trainer.failed_at.tolist() if trainer.failed_at is not None else []) if step}
    losses = trainer.member_losses()
    results = []
    for index, member in enumerate(members):
        if index in trainer.best_states:
            array.load_member_state(index, trainer.best_states[index])
        array.copy_member_into(index, member.model)
        state = member.state
        state.global_step, state.max_steps = output.global_step, trainer.state.max_steps
        state.epoch, state.num_train_epochs = trainer.state.epoch, trainer.state.num_train_epochs
        results.append(MemberResult(
            TrainOutput(output.global_step, losses[index],
                        {"train_runtime": seconds, "train_loss": losses[index],
                         "epoch": trainer.state.epoch}),
            failed.get(index), seconds, trainer.state.epoch, len(members), peak))
    return results
