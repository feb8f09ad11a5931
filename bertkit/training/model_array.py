"""The finetunes of a grid that share their shapes, trained as one model through Trainer.

A ModelArray holds the members' parameters stacked (torch.func.stack_module_state: one
[members, ...] tensor per parameter) and runs the task's own Hugging Face model under
`vmap` over them (functional_call on a template of the model on the meta device): one
forward, one backward and one optimizer step for every member, where one job per member
would launch each of them once per member (HFTA, Wang et al., MLSys 2021).

Each member stays the run it would be alone:

- its model is built by its own job (its seed: the head's initialisation), its batches come
  from its own trainer's dataloader (its seed: the data order);
- its learning rate, weight decay and schedule are its own optimizer's and scheduler's,
  built by its own trainer as Trainer builds them (any lr_scheduler_type, its warmup, the
  layer-wise rates of finetuning.layer_lr_decay), and read back each step: ArrayAdamW applies
  them per member, broadcast over the stacked parameters;
- its gradients are clipped at its max_grad_norm by the norm of its own gradients;
- its losses are logged into its own history, its evaluations run on its own model.

The loss Trainer backpropagates is the sum of the members' losses: each member's parameters
see the gradient of its own loss only. A member whose gradients turn non-finite stops
updating there (the others go on) and is reported failed (`failed_at`).
"""

from __future__ import annotations

import copy
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

class ArrayAdamW(torch.optim.Optimizer):
    """AdamW over the stacked parameters with each member's learning rate, weight decay,
    betas and epsilon, read each step from that member's own optimizer groups (which its own
    scheduler moves: MemberSchedules), and each member's gradients clipped at its
    max_grad_norm by their own norm, as torch.nn.utils.clip_grad_norm_ clips a model's.

    Written here because torch's AdamW takes one learning rate per group, and a group here
    holds one tensor for every member. The update is torch's AdamW's, term for term."""

    def __init__(self, array: ModelArray, member_models: Sequence[nn.Module],
                 member_optimizers: Sequence[torch.optim.Optimizer],
                 max_grad_norms: Sequence[float]):
        names = [name for name in array.stacked]
        super().__init__([{"params": [array.stacked[name]], "name": name} for name in names],
                         {"lr": 0.0})
        self.member_optimizers = list(member_optimizers)
        # For each stacked parameter, the group holding it in each member's optimizer.
        self.member_groups: list[list[dict]] = []
        for name in names:
            path = name.replace(SEPARATOR, ".")
            groups = []
            for model, optimizer in zip(member_models, member_optimizers, strict=True):
                parameter = model.get_parameter(path)
                groups.append(next(group for group in optimizer.param_groups
                                   if any(p is parameter for p in group["params"])))
            self.member_groups.append(groups)
        self.max_grad_norms = torch.tensor([float(n) for n in max_grad_norms])
        self.alive = torch.ones(array.size, dtype=torch.bool)
        self.failed_at = torch.zeros(array.size, dtype=torch.long)  # 0: never
        self.grad_norms = torch.zeros(array.size)
        self.step_count = 0

    def _per_member(self, key: str, groups: list[dict], like: torch.Tensor) -> torch.Tensor:
        values = torch.tensor([float(group[key]) for group in groups], dtype=like.dtype)
        return values.to(like.device).view(-1, *([1] * (like.dim() - 1)))

    @torch.no_grad()
    def step(self, closure=None):
        params = [group["params"][0] for group in self.param_groups]
        device = params[0].device
        if self.alive.device != device:
            self.alive, self.failed_at = self.alive.to(device), self.failed_at.to(device)
            self.max_grad_norms = self.max_grad_norms.to(device)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        # Each member's gradient norm, over its own gradients only.
        squares = torch.stack([g.float().pow(2).flatten(1).sum(1) for g in grads]).sum(0)
        norms = squares.sqrt()
        newly = self.alive & ~torch.isfinite(norms)
        self.failed_at = torch.where(newly, self.step_count + 1, self.failed_at)
        self.alive &= ~newly
        clip = torch.where(self.max_grad_norms > 0,
                           (self.max_grad_norms / (norms + 1e-6)).clamp(max=1.0),
                           torch.ones_like(norms))
        clip = torch.where(self.alive, clip, torch.zeros_like(clip))
        self.grad_norms = norms
        self.step_count += 1
        for p, g, groups in zip(params, grads, self.member_groups, strict=True):
            shape = (-1, *([1] * (p.dim() - 1)))
            g = torch.where(self.alive.view(shape), g * clip.to(g.dtype).view(shape),
                            torch.zeros_like(g))
            state = self.state[p]
            if not state:
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            lr = self._per_member("lr", groups, p) * self.alive.view(shape)
            decay = self._per_member("weight_decay", groups, p)
            beta1 = self._per_member_beta(groups, 0, p)
            beta2 = self._per_member_beta(groups, 1, p)
            eps = self._per_member("eps", groups, p) if "eps" in groups[0] \
                else torch.full_like(lr, 1e-8)
            p.mul_(1 - lr * decay)
            state["exp_avg"].lerp_(g, 1 - beta1)
            state["exp_avg_sq"].mul_(beta2).addcmul_(g, g * (1 - beta2))
            correction1 = 1 - beta1 ** self.step_count
            correction2 = 1 - beta2 ** self.step_count
            denom = (state["exp_avg_sq"].sqrt() / correction2.sqrt()).add_(eps)
            p.addcdiv_(state["exp_avg"] * (lr / correction1), denom, value=-1.0)

    def _per_member_beta(self, groups: list[dict], which: int, like: torch.Tensor):
        values = torch.tensor([float(group.get("betas", (0.9, 0.999))[which])
                               for group in groups], dtype=like.dtype)
        return values.to(like.device).view(-1, *([1] * (like.dim() - 1)))

    def failed_members(self) -> dict[int, int]:
        """Member -> the optimizer step at which its gradients turned non-finite."""
        return {i: step for i, step in enumerate(self.failed_at.tolist()) if step}


class MemberSchedules(torch.optim.lr_scheduler.LRScheduler):
    """Each member's own scheduler (over its own optimizer, which ArrayAdamW reads), stepped
    together; Trainer's log line shows the first member's rate."""

    def __init__(self, schedulers: Sequence, optimizer: ArrayAdamW):
        self.schedulers = list(schedulers)
        self.optimizer = optimizer
        for scheduler in self.schedulers:
            # Each member's optimizer only holds its rates (ArrayAdamW steps): torch's warning
            # that a scheduler steps before its optimizer does not apply.
            scheduler.optimizer._opt_called = True
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
        self.array = array
        self.members = list(members)
        self.pad_token_id = pad_token_id
        self.array_optimizer: ArrayAdamW | None = None
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
        self._window = losses if self._window is None else self._window + losses
        self._total = losses if self._total is None else self._total + losses
        self._window_steps += 1
        return (outputs.loss, outputs) if return_outputs else outputs.loss

    def create_optimizer(self, model=None):
        if self.optimizer is None:
            optimizers = [member.create_optimizer() for member in self.members]
            self.array_optimizer = ArrayAdamW(self.array, [m.model for m in self.members],
                                              optimizers,
                                              [m.args.max_grad_norm for m in self.members])
            self.optimizer = self.array_optimizer  # accelerate wraps it: array_optimizer reads it
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.lr_scheduler is None:
            schedulers = [member.create_scheduler(num_training_steps, member.optimizer)
                          for member in self.members]
            self.lr_scheduler = MemberSchedules(schedulers, self.array_optimizer)
        return self.lr_scheduler

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self._window is not None:  # a training line: each member's own
            means = (self._window / max(self._window_steps, 1)).tolist()
            norms = self.array_optimizer.grad_norms.tolist()
            rates = self.lr_scheduler.member_rates()
            for index, member in enumerate(self.members):
                entry = {"loss": means[index], "grad_norm": norms[index],
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


def array_arguments(args: TrainingArguments) -> TrainingArguments:
    """The array's arguments: the first member's (the members share every one but those
    ArrayAdamW and the members' schedulers apply per member), with Trainer's clipping off
    (each member is clipped by its own norm), no checkpoints (the array trains in one
    process; a member's run keeps no checkpoint once finished), no tracker (each member's
    W&B run gets its own history) and its evaluations at the members' points."""
    array = copy.copy(args)
    array.max_grad_norm = 0.0
    array.save_strategy = "no"
    array.load_best_model_at_end = False
    array.metric_for_best_model = None  # each member picks its own best (keep_if_best)
    array.report_to = []
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
    failed = trainer.array_optimizer.failed_members()
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
            failed.get(index), seconds, trainer.state.epoch))
    return results
