"""Checkpoints a run can trust: each one fsynced once saved, judged whole by its files'
content before a resume reads it, written (then the job stopped) on a preemption signal, and
an overwritten run's set aside (then removed) before the new run saves its own. One module
because every part answers the same question: is the run's newest checkpoint one it can
resume from, and is it this run's?
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import struct
import tempfile
import threading
import zipfile
from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import TrainerCallback
from transformers.trainer import (
    FSDP_MODEL_NAME,
    OPTIMIZER_NAME,
    SCHEDULER_NAME,
    TRAINER_STATE_NAME,
)
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import (
    ADAPTER_SAFE_WEIGHTS_NAME,
    ADAPTER_WEIGHTS_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
)

from bertkit.data.atomic_files import DamagedFile, read_json
from bertkit.training.trainer import callbacks_of

# ================================================================================================
# Whether a checkpoint's files are whole, judged by their content, cheaply.
#
# On cluster filesystems (NFS, Lustre) and after a node crash, files written without fsync do
# not reach the disk in the order they were written: a checkpoint can hold a whole
# trainer_state.json beside half a model.safetensors. So no single file vouches for the
# others; each file a resume reads is checked itself, without loading tensors:
#
#     *.safetensors   the header's length, its JSON, and the tensors' last byte against the
#                     file's size
#     *.pt *.pth *.bin torch.save's zip: the central directory at the end, and every entry
#                     inside the part of the file before it (a file cut anywhere loses either)
#     *.json          parses
#
# and the files Trainer's resume needs must be there (it silently starts a fresh optimizer
# when optimizer.pt is missing, for instance).

STATE_FILE = TRAINER_STATE_NAME
# The weights Trainer saves (whole, or sharded with an index; PEFT's adapter files); FSDP's
# sharded state dict is a folder (pytorch_model_fsdp_0/).
WEIGHTS_FILES = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME,
                 ADAPTER_SAFE_WEIGHTS_NAME, ADAPTER_WEIGHTS_NAME)
WEIGHTS_FOLDERS = (FSDP_MODEL_NAME,)
OPTIMIZER_FILE, SCHEDULER_FILE = OPTIMIZER_NAME, SCHEDULER_NAME
# FSDP's sharded optimizer (optimizer_0/) and DeepSpeed's state (global_step<N>/) are folders.
OPTIMIZER_FOLDERS = ("optimizer_", "global_step")
RNG_PATTERN = "rng_state*.pth"  # rng_state.pth, or rng_state_<rank>.pth under DDP
TORCH_SUFFIXES = (".pt", ".pth", ".bin")


def safetensors_fault(path: Path) -> str | None:
    """Why a safetensors file is not whole: its 8-byte header length, the JSON header, and
    the end of its last tensor against the file's size."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            return f"cut short ({size} bytes, not even the header's length)"
        (length,) = struct.unpack("<Q", head)
        if 8 + length > size:
            return f"cut short ({size} bytes; the header alone needs {8 + length})"
        try:
            header = json.loads(handle.read(length))
        except (ValueError, UnicodeDecodeError):
            return "its header is not valid JSON"
    ends = [entry["data_offsets"][1] for name, entry in header.items()
            if name != "__metadata__" and isinstance(entry, dict) and "data_offsets" in entry]
    expected = 8 + length + max(ends, default=0)
    if size != expected:
        return f"cut short ({size} bytes; its header describes {expected})"
    return None


def torch_file_fault(path: Path) -> str | None:
    """Why a torch.save file is not whole: a zip archive whose central directory (the last
    bytes written) reads back and whose entries all lie before it."""
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
            directory_start = archive.start_dir
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return f"cut short (not a whole torch.save archive; {path.stat().st_size} bytes)"
    for entry in entries:
        if entry.header_offset + entry.compress_size > directory_start:
            return f"cut short (entry {entry.filename} runs past the archive's directory)"
    return None


def json_fault(path: Path) -> str | None:
    try:
        read_json(path, expect=object)
    except DamagedFile:
        return "cut short (not valid JSON)"
    return None


def file_fault(path: Path) -> str | None:
    """Why one checkpoint file is not whole, by its kind; None when whole or of a kind not
    checked (a tokenizer's vocab.txt)."""
    if path.name.endswith(".safetensors"):
        return safetensors_fault(path)
    if path.name.endswith(TORCH_SUFFIXES):
        return torch_file_fault(path)
    if path.name.endswith(".json"):
        return json_fault(path)
    return None


def missing_files(folder: Path, *, weights_only: bool = False) -> list[str]:
    """The files Trainer's resume reads that `folder` lacks (weights_only: a checkpoint saved
    with trainer.save_only_model holds no optimizer, scheduler or RNG state)."""
    names = {path.name for path in folder.iterdir()}
    has_folder = lambda prefixes: any(  # noqa: E731 - one line, used twice
        name.startswith(prefixes) and (folder / name).is_dir() for name in names)
    missing = [] if STATE_FILE in names else [STATE_FILE]
    if not names.intersection(WEIGHTS_FILES) and not has_folder(WEIGHTS_FOLDERS):
        missing.append(f"weights ({SAFE_WEIGHTS_NAME})")
    if weights_only:
        return missing
    if OPTIMIZER_FILE not in names and not has_folder(OPTIMIZER_FOLDERS):
        missing.append(OPTIMIZER_FILE)
    if SCHEDULER_FILE not in names:
        missing.append(SCHEDULER_FILE)
    if not any(folder.glob(RNG_PATTERN)):
        missing.append("rng_state.pth (nor any rng_state_<rank>.pth)")
    return missing


def index_shards(folder: Path) -> list[str]:
    """The shard files a sharded weights index names."""
    shards = set()
    for index in folder.glob("*.index.json"):
        try:
            shards.update(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
            continue  # the index's own fault is told by file_fault
    return sorted(shards)


def checkpoint_fault(folder: Path, *, weights_only: bool = False) -> str | None:
    """Why `folder` cannot be resumed from, naming the file; None when every file it holds
    is whole and none that the resume reads is missing."""
    missing = missing_files(folder, weights_only=weights_only)
    missing += [shard for shard in index_shards(folder) if not (folder / shard).is_file()]
    if missing:
        return f"no {', no '.join(missing)} (the save was cut short)"
    for path in sorted(folder.iterdir()):
        if path.is_file():
            why = file_fault(path)
            if why is not None:
                return f"{path.name} is {why}"
    return None


# ================================================================================================
# The checkpoint a run resumes from: the newest whole one.
#
# A job killed while Trainer writes a checkpoint (preemption during a save is ordinary on a
# cluster: BERT-large's weights and optimizer state take seconds to write) leaves a folder with
# some of its files, the last one cut short; after a node crash, or on NFS and Lustre, any of
# them may be cut, whatever order they were written in. transformers' get_last_checkpoint takes
# the newest folder whatever it holds, and resuming from a torn one ends in a safetensors or
# FileNotFoundError traceback although a whole checkpoint lies beside it. So each checkpoint is
# judged by the content of the files the resume reads (checkpoint_fault, above), and
# bertkit fsyncs a checkpoint's files once Trainer has saved them
# (DurableCheckpoints, below).

logger = logging.getLogger(__name__)

_CHECKPOINT = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")


@dataclass
class CheckpointScan:
    """The newest complete checkpoint (None: none is), and each newer one skipped with why."""

    complete: Path | None
    skipped: list[tuple[Path, str]] = field(default_factory=list)

    def describe_skipped(self) -> str:
        return "; ".join(f"{folder.name}: {why}" for folder, why in self.skipped)


def checkpoint_step(folder: Path) -> int | None:
    match = _CHECKPOINT.match(folder.name)
    return int(match.group(1)) if match else None


def checkpoint_folders(output_dir: str | Path) -> list[Path]:
    """The checkpoint-N folders of output_dir, by step ([] when it does not exist)."""
    directory = Path(output_dir)
    if not directory.is_dir():
        return []
    return sorted((path for path in directory.iterdir()
                   if checkpoint_step(path) is not None and path.is_dir()), key=checkpoint_step)


def scan_checkpoints(output_dir: str | Path, *, weights_only: bool = False) -> CheckpointScan:
    """Checkpoints from the newest step down to the first whole one (weights_only: the run
    saves with trainer.save_only_model, without optimizer, scheduler and RNG states)."""
    scan = CheckpointScan(None)
    for folder in reversed(checkpoint_folders(output_dir)):
        why = checkpoint_fault(folder, weights_only=weights_only)
        if why is None:
            scan.complete = folder
            break
        scan.skipped.append((folder, why))
    return scan


# ================================================================================================
# A checkpoint counts as saved once its files are on the disk, not in the page cache.
#
# Trainer writes a checkpoint's files without fsync; after a node crash, or on NFS and Lustre,
# some may never reach the disk, or reach it cut short, whatever their order. Once Trainer has
# saved (on_save), each process fsyncs the checkpoint's files and the folders that name them
# (the checkpoint's own and the one holding it), so a checkpoint that a resume finds is whole
# unless the machine died during this very save; checkpoint_fault judges the
# rest by content. One fsync per file, after a save that wrote them anyway: the cost is the
# time the disk takes to hold what Trainer wrote. fsync_checkpoints=false turns it off
# (conf/config.yaml).

def fsync_path(path: Path) -> bool:
    """fsync one file or folder (a folder's entries: the names of the files in it); False for
    one gone since the folder was listed. Under DDP every process fsyncs the checkpoint while
    the main process may still be writing a file of its own into it atomically (its training
    clock: a temporary file renamed into place), so a name listed a moment ago may be gone:
    the process that wrote it fsyncs it."""
    try:
        fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    except FileNotFoundError:
        return False
    try:
        os.fsync(fd)
    except OSError as err:  # some filesystems refuse fsync on a folder (EINVAL)
        logger.debug("fsync %s: %s", path, err)
    finally:
        os.close(fd)
    return True


def fsync_tree(folder: Path) -> int:
    """fsync every file under `folder`, then each folder (deepest first) and `folder`'s
    parent; returns how many files."""
    files = 0
    for root, _, names in os.walk(folder, topdown=False):
        for name in names:
            files += fsync_path(Path(root) / name)
        fsync_path(Path(root))
    fsync_path(folder.parent)
    return files


class DurableCheckpoints(TrainerCallback):
    """fsyncs each checkpoint as soon as Trainer has written it."""

    def on_save(self, args, state, control, **kwargs):
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if folder.is_dir():
            logger.debug("fsynced %d files of %s", fsync_tree(folder), folder)
        return control


# ================================================================================================
# Preemption: a signal stops the run at the end of the current step, with a checkpoint.
#
# SLURM and most schedulers send SIGTERM some seconds before they kill a preempted job; a
# submitit job gets its own signal (USR2 by default: SUBMITIT_PREEMPT_SIGNAL), on which submitit
# requeues the job and exits at once, losing everything since the last periodic checkpoint.
# Here the signal only raises a flag. At the end of an optimizer step Trainer saves a
# checkpoint and stops (every process of a distributed run at the same step: the flag is
# reduced over them every `agree_every_steps` steps), then the job ends with Preempted: exit
# status 128 + the signal for a
# plain job; for submitit, its own handler runs now (checkpoint/requeue), and the requeued job
# continues from that checkpoint with resume=auto.
#
# Ctrl-C (SIGINT) is handled the same way: the run saves at the step's end and stops, exit
# status 130, with the command that resumes it. A second Ctrl-C stops at once: the first one
# puts Python's own handler back, whose KeyboardInterrupt the CLI tells in one line (a user who
# presses it twice does not want to wait for the step). A process that ignores SIGINT (started
# in the background by a non-interactive shell) keeps ignoring it.
#
# The grace period may be 30 s for everything, so after the signal the run does nothing a
# resume does not need: callbacks that score (the held-out evaluation) ask `preempting` and
# skip, and Trainer's end of training neither loads the best checkpoint back (the process
# exits) nor, under save_total_limit=1, deletes the checkpoint just saved as not the best; no
# metrics.json, model or card is written after it (Preempted unwinds the job).

SUBMITIT_SIGNAL_ENV = "SUBMITIT_PREEMPT_SIGNAL"


class Preempted(Exception):
    """The run saved a checkpoint and stopped on a preemption signal."""

    def __init__(self, signum: int, step: int, checkpoint_dir: str, handler=None):
        self.signum, self.step, self.handler = signum, step, handler
        self.checkpoint = f"{checkpoint_dir}/{PREFIX_CHECKPOINT_DIR}-{step}"
        stopped = ("interrupted (Ctrl-C)" if signum == signal.SIGINT
                   else f"preempted by {signal.Signals(signum).name}")
        self.stopped = f"{stopped} at step {step}: checkpoint saved in {self.checkpoint}"
        super().__init__(f"{self.stopped}; the same command with resume=auto continues from it")

    @property
    def exit_status(self) -> int:
        return 128 + self.signum

    def hand_over(self) -> None:
        """Runs the handler the signal had before the run (submitit's checkpoint/requeue,
        which exits), if it had one; not Ctrl-C's (Python's raises KeyboardInterrupt)."""
        if self.signum != signal.SIGINT and callable(self.handler):
            self.handler(self.signum, None)


def preemption_signals() -> list[int]:
    """SIGTERM, SIGINT (Ctrl-C) unless the process ignores it, and submitit's preemption
    signal inside a submitit job."""
    signals = [signal.SIGTERM]
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signals.append(signal.SIGINT)
    if os.environ.get("SUBMITIT_JOB_ID") or os.environ.get(SUBMITIT_SIGNAL_ENV):
        name = os.environ.get(SUBMITIT_SIGNAL_ENV, "USR2").upper().removeprefix("SIG")
        submitit = getattr(signal, f"SIG{name}", None)
        if submitit is not None and submitit not in signals:
            signals.append(submitit)
    return signals


class PreemptionCallback(TrainerCallback):
    """Catches the preemption signals during training; saves and stops at the step's end."""

    def __init__(self, agree_every_steps: int, signals: list[int] | None = None):
        """agree_every_steps: under DDP, the processes compare their flags at every this many
        optimizer steps (one collective each time, not one per step)."""
        self.signals = preemption_signals() if signals is None else signals
        self.agree_every_steps = max(1, int(agree_every_steps))
        self.received: int | None = None
        self.stopped_at: int | None = None
        self.previous: dict[int, object] = {}

    def _catch(self, signum, frame):
        if signum == signal.SIGINT:
            # The next Ctrl-C raises KeyboardInterrupt at once (Python's own handler).
            signal.signal(signal.SIGINT, signal.default_int_handler)
            logger.warning("caught Ctrl-C: saving a checkpoint at the end of this step, then "
                           "stopping (Ctrl-C again stops at once, without it)")
        else:
            logger.warning("caught %s: saving a checkpoint at the end of this step, then "
                           "stopping", signal.Signals(signum).name)
        if self.received is None:
            self.received = signum

    def on_train_begin(self, args, state, control, **kwargs):
        # Python runs signal handlers in the main thread only (a run in a worker thread, as
        # some launchers do, keeps the default behaviour).
        if threading.current_thread() is threading.main_thread():
            for signum in self.signals:
                self.previous[signum] = signal.signal(signum, self._catch)

    def on_step_end(self, args, state, control, **kwargs):
        if self._any_process_received(state.global_step):
            self.stopped_at = state.global_step
            control.should_save = True
            control.should_training_stop = True

    def on_save(self, args, state, control, **kwargs):
        if self.stopped_at == state.global_step:
            # Saved in this checkpoint's trainer_state.json, where the resume reads it; in
            # memory it would make Trainer's end of training load the best model back, and
            # under save_total_limit=1 delete this checkpoint as not the best.
            state.best_model_checkpoint = None

    def on_train_end(self, args, state, control, **kwargs):
        self.restore_handlers()

    def restore_handlers(self) -> None:
        """The handlers from before training. Also called when training raises (on_train_end
        never runs then): a handler left behind would outlive the run, and a process forked
        later (a datasets worker pool) would ignore the SIGTERM that ends it."""
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def _any_process_received(self, step: int) -> bool:
        """Every process stops at the same step: the schedulers signal them at different
        moments, and a process that saved alone would wait for the others forever. They agree
        at every agree_every_steps-th step only: a collective and its read-back stop the host
        until the GPU drains, and a scheduler's grace period spans many steps."""
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return self.received is not None
        if step % self.agree_every_steps:
            return False
        flag = torch.tensor([0 if self.received is None else self.received], dtype=torch.int64)
        if torch.distributed.get_backend() == "nccl":
            flag = flag.cuda()
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        if flag.item() and self.received is None:
            self.received = int(flag.item())
        return bool(flag.item())

    def raise_if_stopped(self, checkpoint_dir: str) -> None:
        """After Trainer.train returned: Preempted when a signal stopped it."""
        if self.stopped_at is not None:
            raise Preempted(self.received, self.stopped_at, checkpoint_dir,
                            self.previous.get(self.received))


class ResumedFrom(TrainerCallback):
    """Says in one line where a resumed run goes on from: the checkpoint, its step, and the
    steps the run plans (Trainer's own lines say it only at debug level)."""

    def __init__(self, checkpoint: str | None):
        self.checkpoint = checkpoint

    def on_train_begin(self, args, state, control, **kwargs):
        if self.checkpoint is not None and state.is_world_process_zero:
            logger.info("resumed from %s: step %d of %d", self.checkpoint, state.global_step,
                        state.max_steps)
        return control


def preempting(trainer) -> bool:
    """Whether a preemption signal has reached `trainer`'s run: slow work it would do now
    (scoring) is not what a resume needs, and the grace period is short."""
    return any(isinstance(callback, PreemptionCallback) and callback.received is not None
               for callback in callbacks_of(trainer))


# ================================================================================================
# overwrite=true: the earlier run is set aside, then removed once the new run has started.
#
# An overwritten run must leave nothing that a later step reads: its checkpoints above all
# (resume=auto after a preemption, or resume=true, would continue the old run's newest one),
# but also its predictions, model, metrics, card and W&B run files. Deleting it before the new
# run starts would lose it to a new run that fails at once (a mistyped data path), so every
# entry of the run directory is moved into a hidden folder beside it, named on stderr or in
# the log, and that folder is removed once the new run has started: when its training begins
# (its data read and its model built: RemoveSetAsideRun, on the main process), or, for a job
# that trains nothing in this process (a benchmark), when it has finished. A run that fails
# before that leaves the folder where the line said.

SET_ASIDE_NAME = ".{name}.overwritten-"  # the folder's prefix, beside the run directory
_set_aside: ContextVar[Path | None] = ContextVar("bertkit_set_aside", default=None)


def set_aside(run_dir: Path, keep: Iterable[str] = ()) -> Path | None:
    """Moves every entry of run_dir but `keep` (the names a sweep job's Hydra has just written)
    into a new hidden folder beside it, remembered for remove_set_aside; returns the folder
    (None: nothing to move). Checkpoints go first and result files last, so that another
    process of the launch that looks meanwhile never sees the old checkpoints without the
    result file that makes them a finished run's."""
    run_dir = Path(run_dir)
    entries = [path for path in run_dir.iterdir() if path.name not in set(keep)] \
        if run_dir.is_dir() else []
    if not entries:
        return None
    folder = Path(tempfile.mkdtemp(prefix=SET_ASIDE_NAME.format(name=run_dir.name),
                                   dir=run_dir.parent))
    for path in sorted(entries, key=lambda path: (not path.is_dir(), path.name)):
        os.replace(path, folder / path.name)
    _set_aside.set(folder)
    return folder


def remove_set_aside() -> None:
    """The new run has started: the run set aside for it is removed."""
    folder = _set_aside.get()
    if folder is None:
        return
    _set_aside.set(None)
    shutil.rmtree(folder, ignore_errors=True)
    logger.info("overwrite=true: removed the earlier run set aside in %s", folder)


def forget_set_aside() -> Path | None:
    """The new run failed before it started: the folder stays (the line that set it aside
    named it) and is no longer this process's to remove; returns it."""
    folder = _set_aside.get()
    _set_aside.set(None)
    return folder


class RemoveSetAsideRun(TrainerCallback):
    """Removes the overwritten run set aside for this one once its training begins."""

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            remove_set_aside()
        return control
