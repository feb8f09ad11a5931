"""Host syncs counted on any device, the CPU included: the operations that make the host wait
for an accelerator to drain its queue (`.item()`, `nonzero`, boolean-mask indexing, ...), seen by
a TorchDispatchMode and recorded per optimizer step of a Trainer run, the collator's own work
left out. docs/speed.md ("How host syncs are counted") lists the ops and where a step
begins and ends."""

from __future__ import annotations

import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import TrainerCallback

aten = torch.ops.aten

# Ops whose result the host needs before it can go on.
ALWAYS_SYNC = {
    aten._local_scalar_dense.default,
    aten.nonzero.default,
    aten.nonzero_static.default,
    aten.masked_select.default,
    aten._unique.default,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
}
BOOLEAN_INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default,
                    aten._index_put_impl_.default}
REPEAT_INTERLEAVE = {aten.repeat_interleave.Tensor, aten.repeat_interleave.self_Tensor}


def _is_sync(func, args, kwargs) -> bool:
    if func in ALWAYS_SYNC:
        return True
    if func in BOOLEAN_INDEXING:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)
                   for index in indices or ())
    if func in REPEAT_INTERLEAVE:
        return kwargs.get("output_size") is None
    return False


def _caller() -> str:
    """The innermost frame outside torch: who asked for the value."""
    for frame in reversed(traceback.extract_stack()[:-3]):
        if "/torch/" not in frame.filename and "host_syncs.py" not in frame.filename:
            return f"{frame.filename.rsplit('site-packages/', 1)[-1]}:{frame.lineno} " \
                   f"({frame.name})"
    return "?"


@dataclass(frozen=True)
class Sync:
    step: int | None  # None: before the first step or after the last
    op: str
    caller: str


class HostSyncCounter(TorchDispatchMode):
    """Records every sync op while active and not paused; `step` is set by SyncStepCallback."""

    def __init__(self):
        super().__init__()
        self.syncs: list[Sync] = []
        self.step: int | None = None
        self._paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self._paused and _is_sync(func, args, kwargs):
            self.syncs.append(Sync(self.step, str(func.overloadpacket.__name__), _caller()))
        return func(*args, **kwargs)

    def excluding(self, function: Callable) -> Callable:
        """`function` with its own ops not counted (the collator: host work by design)."""

        def uncounted(*args, **kwargs):
            self._paused += 1
            try:
                return function(*args, **kwargs)
            finally:
                self._paused -= 1

        return uncounted

    def watch(self, trainer) -> SyncStepCallback:
        """Counts `trainer`'s steps (its collator left out); returns what marks them."""
        steps = SyncStepCallback(self)
        trainer.add_callback(steps)
        trainer.data_collator = self.excluding(trainer.data_collator)
        return steps

    def per_step(self) -> Counter:
        return Counter(sync.step for sync in self.syncs if sync.step is not None)

    def where(self, steps) -> Counter:
        """(op, caller) -> count over `steps`: what a failing test prints."""
        steps = set(steps)
        return Counter((sync.op, sync.caller) for sync in self.syncs if sync.step in steps)


class SyncStepCallback(TrainerCallback):
    """Tells the counter which optimizer step is running, and which steps logged."""

    def __init__(self, counter: HostSyncCounter):
        self.counter = counter
        self.logged_steps: set[int] = set()

    def on_step_begin(self, args, state, control, **kwargs):
        self.counter.step = state.global_step + 1

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logged_steps.add(state.global_step)

    def on_evaluate(self, args, state, control, **kwargs):
        self.logged_steps.add(state.global_step)

    def on_save(self, args, state, control, **kwargs):
        self.logged_steps.add(state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        self.counter.step = None
