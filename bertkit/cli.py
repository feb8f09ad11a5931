"""The `bertkit` command: Hydra composes the config, bertkit.jobs runs it, and the job's main
metric goes back to Hydra (for sweepers: successive halving, Optuna).

Bad input surfaces as a BertkitError and is printed as one line, not a traceback. In a
multirun (sweep) a failed job, whatever the error (bad input, out of memory, a diverging
setting), is recorded in its run directory as failed.json and the sweep goes on.

The jobs, and with them torch and transformers, are imported where a job runs, not when the
command starts: `bertkit --help`, tab completion and a refused value answer in about a second
(tests/test_cli_help.py).

Secrets (bertkit.secret_masking) are masked in everything this edge writes or prints: the
one-line errors, failed.json, what Hydra writes and logs itself (MaskSecrets), and whatever
the process prints (masked_output: Hydra's syntax errors and failed runs).

A multirun in which any job failed exits 1 once every job ran, with a summary naming each
failed job, its overrides and its one-line error (FailedJobsCheck, read from the failed.json
files the launch wrote, whichever launcher or sweeper ran the jobs).

A run directory that holds a finished run is refused (bertkit.jobs.check_finished_run): for a
single run by FinishedRunCheck, a Hydra callback, before Hydra creates the directory or
writes .hydra/ and the log into it; for a sweep job by run_job, as the job starts (Hydra 1.3
calls nothing between writing a job's .hydra/ and running it), a failed job like any other.
The same two places leave a finished run as it is under resume=true|auto, and set an earlier
run aside under overwrite=true.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import hydra
import hydra._internal.utils as hydra_utils
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn
from hydra.errors import ConfigCompositionException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException, ValidationError

from bertkit.config_schema import check_launch, composed_field, expected_type
from bertkit.config_tree import config_dir
from bertkit.data.atomic_files import write_json_atomic, write_text_atomic
from bertkit.data.metrics_file import FAILED_FILE
from bertkit.errors import BertkitError
from bertkit.secret_masking import (
    mask_logs,
    mask_secrets,
    mask_text,
    masked_output,
    remember_command_line,
    remember_secrets,
)

if TYPE_CHECKING:  # bertkit.jobs imports torch: only where a job runs
    from bertkit.jobs import Job

logger = logging.getLogger("bertkit")
# The job a script of one's own runs through this command (main's `job`); None: recipe.job's.
_script_job: Job | None = None


def sweep_stamp() -> str:
    """The name of the multirun's directory (its start time by default), the same for every
    job of one sweep (${bertkit_sweep_stamp:} in a config; W&B's sweep id ends with it too,
    training.wandb_logging). Outside a multirun, the run's own stamp."""
    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        return Path(HydraConfig.get().sweep.dir).name
    return run_stamp()


def run_stamp() -> str:
    """training.run.run_stamp, imported when a config is resolved (a run), not at the start."""
    from bertkit.training.run import run_stamp

    return run_stamp()


def _wandb_resolver(name: str):
    """training.wandb_logging's resolver `name`, imported when a config is resolved."""
    def resolve(*args):
        from bertkit.training import wandb_logging

        return getattr(wandb_logging, name)(*args)
    return resolve


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("bertkit_run_stamp"):
        OmegaConf.register_new_resolver("bertkit_run_stamp", run_stamp, use_cache=True)
    if not OmegaConf.has_resolver("bertkit_sweep_stamp"):
        OmegaConf.register_new_resolver("bertkit_sweep_stamp", sweep_stamp)
    # A multirun's W&B id, groups and names (conf/logger/wandb.yaml): not cached, each job's own.
    # A multirun job's directory, its swept settings (conf/config.yaml's hydra.sweep.subdir).
    for resolver, function in (("bertkit_sweep_id", "sweep_id"), ("bertkit_wandb_group", "group"),
                               ("bertkit_wandb_name", "name"), ("bertkit_job_dir", "job_dir")):
        if not OmegaConf.has_resolver(resolver):
            OmegaConf.register_new_resolver(resolver, _wandb_resolver(function))


def describe_failure(err: BaseException) -> str:
    """One line for failed.json and the report: bertkit's own message as it is, anything else
    prefixed with its type (torch.OutOfMemoryError, ValueError, ...)."""
    if isinstance(err, BertkitError):
        return str(err)
    return f"{type(err).__module__}.{type(err).__qualname__}: {err}".removeprefix("builtins.")


def record_failed_job(err: BaseException) -> None:
    """failed.json (the error, and the traceback unless it is bertkit's own message), the
    job's W&B run closed as failed, and GPU memory handed back for the next job."""
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    record = {"error": describe_failure(err), "job": hydra_cfg.job.num,
              "overrides": list(hydra_cfg.overrides.task)}
    if not isinstance(err, BertkitError):
        record["traceback"] = "".join(traceback.format_exception(err))
    record = mask_secrets(record)
    try:
        write_json_atomic(run_dir / FAILED_FILE, record)
    except BertkitError as unwritten:  # a full disk: told, and the job's own error still is
        logger.error("job %s: %s", hydra_cfg.job.num, mask_text(str(unwritten)))
    logger.error("job %s failed: %s", hydra_cfg.job.num, record["error"])
    if "wandb" in sys.modules:
        import wandb

        if wandb.run is not None:
            wandb.run.finish(exit_code=1)
    if "torch" in sys.modules:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def release_process_group() -> None:
    """torchrun's processes leave the process group before exiting: gloo's threads torn down
    at interpreter exit otherwise abort a rank now and then ("terminate called without an
    active exception", SIGABRT; pytorch/pytorch#190489). Only after a job that succeeded on
    every rank (a rank that failed may leave the others inside a collective, where destroying
    the group would hang), and only for a single run: a sweep's later jobs in this process
    still need the group."""
    if "torch" not in sys.modules:
        return
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def sweeper_value(result: dict | None) -> float | None:
    """What Hydra's sweepers read from a job (its JobReturn.return_value): the main dev metric
    of a finetune, or of a pretraining job's first downstream finetune; None otherwise."""
    result = result or {}
    if "main_value" in result:
        return float(result["main_value"])
    downstream = result.get("downstream") or {}
    first = next(iter(downstream.values()), None)
    return float(first["main_value"]) if first else None


def mask_yaml_file(path: Path) -> None:
    """A YAML file Hydra wrote, rewritten with its secrets masked (left alone without any)."""
    if not path.is_file():
        return
    loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    masked = mask_secrets(loaded)
    if masked != loaded:
        write_text_atomic(path, OmegaConf.to_yaml(OmegaConf.create(masked)))


class MaskSecrets(Callback):
    """What Hydra writes itself (hydra.callbacks in conf/config.yaml): the job's .hydra/ files
    (its config, overrides and hydra.yaml, which holds the overrides again) and the sweep's
    multirun.yaml are written, secrets and all, an instant before the job starts: they are
    rewritten masked here, before the job runs. The log is masked in the job's process too (a
    launcher may start it elsewhere: submitit). A single run's overrides are masked in what
    Hydra reports of the job, which it prints when the job failed ("Error executing job with
    overrides: [...]"); a sweep's are left to its sweeper, which may read them."""

    def on_job_start(self, config: DictConfig, **kwargs) -> None:
        mask_logs()
        runtime = config.hydra.runtime
        if config.hydra.output_subdir is not None:
            hydra_dir = Path(runtime.output_dir) / str(config.hydra.output_subdir)
            for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
                mask_yaml_file(hydra_dir / name)
        if config.hydra.mode == RunMode.MULTIRUN:
            mask_yaml_file(Path(runtime.cwd) / str(config.hydra.sweep.dir) / "multirun.yaml")

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs) -> None:
        if config.hydra.mode == RunMode.RUN and job_return.overrides is not None:
            job_return.overrides = mask_secrets(list(job_return.overrides))


def exit_with_error(message: str) -> NoReturn:
    """bertkit's one line for bad input, secrets masked, exit status 2."""
    print(mask_text(f"bertkit: error: {message}"), file=sys.stderr)
    sys.exit(2)


def run_job(cfg: DictConfig) -> dict | None:
    """bertkit.jobs.run_job, imported as the job starts (and so torch and transformers), of
    recipe.job or of a script's own job (main's `job`)."""
    from bertkit.jobs import run_job

    return run_job(cfg, job=_script_job)


def _hydra_task(cfg: DictConfig) -> float | None:
    return sweeper_value(run_guarded(cfg, run_job))


def run_guarded(cfg: DictConfig, work: Callable[[DictConfig], Any]) -> Any:
    """work(cfg) as a job of the command: a preemption hands over, Ctrl-C stops quietly, and
    in a multirun a failure is recorded as the job's (failed.json, None returned) while the
    other jobs go on. `work`: run_job, or one step of a job a launcher runs in steps
    (hydra/launcher=fused: bertkit.jobs.fused)."""
    from bertkit.training.run import join_submitit_tasks
    from bertkit.training.stop_and_resume import Preempted

    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    remember_secrets(cfg)
    join_submitit_tasks()
    try:
        result = work(cfg)
        if not multirun:
            release_process_group()
        return result
    except Preempted as err:  # not a failure: the job goes on from its checkpoint
        print(mask_text(f"bertkit: {err.stopped}; to continue: {resume_command()}"),
              file=sys.stderr)
        err.hand_over()
        sys.exit(err.exit_status)
    except KeyboardInterrupt:  # a second Ctrl-C, or one outside training: stop now, quietly
        print(mask_text(f"bertkit: stopped by Ctrl-C; {what_resumes()}"), file=sys.stderr)
        sys.exit(INTERRUPTED_STATUS)
    except BertkitError as err:
        if not multirun:
            exit_with_error(str(err))
        record_failed_job(err)
        return None
    except Exception as err:  # noqa: BLE001 - a sweep outlives any one job's failure
        if not multirun:
            raise
        record_failed_job(err)
        return None


INTERRUPTED_STATUS = 128 + signal.SIGINT  # a shell's status for a command ended by Ctrl-C
# What a resume command leaves out of the interrupted command's overrides (it sets its own).
NOT_RESUMED = ("resume", "overwrite")


def resume_command() -> str:
    """The command that continues this job from its newest checkpoint: for a single run, the
    same overrides with its run directory (a default one is named by its start time, so "the
    same command" alone would start a new run) and resume=auto; for a sweep, the same sweep
    into its directory."""
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode == RunMode.MULTIRUN:
        return (f"the same sweep with hydra.sweep.dir={shlex.quote(str(hydra_cfg.sweep.dir))} "
                f"resume=auto")
    kept = [str(o) for o in hydra_cfg.overrides.task
            if str(o).split("=", 1)[0].lstrip("+~") not in NOT_RESUMED]
    words = ["bertkit", *kept, f"hydra.run.dir={hydra_cfg.runtime.output_dir}", "resume=auto"]
    return " ".join(shlex.quote(word) for word in words)


def what_resumes() -> str:
    """After a Ctrl-C that stopped the job at once: the newest complete checkpoint and the
    command that continues from it, or that there is none."""
    from bertkit.training.run import CHECKPOINTS_DIR
    from bertkit.training.stop_and_resume import scan_checkpoints

    checkpoints = Path(HydraConfig.get().runtime.output_dir) / CHECKPOINTS_DIR
    newest = scan_checkpoints(checkpoints).complete
    if newest is None:
        return "no checkpoint was saved, nothing to continue from"
    return f"no checkpoint saved now; the newest, {newest}, continues with: {resume_command()}"


class FinishedRunCheck(Callback):
    """hydra.callbacks.finished_run (conf/config.yaml): a single run's directory is checked
    before Hydra writes anything into it, so that a refused run, or resume=true|auto on a
    finished one (exit status 0, one line), leaves the finished run as it was, .hydra/ and its
    log included; with overwrite=true the whole earlier run, its .hydra/ and log too, is set
    aside before Hydra writes the new one's (main process). It exits itself: Hydra turns an
    exception raised in a callback into a warning and goes on."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        from bertkit.jobs import (
            FINISHED,
            JOBS,
            SET_ASIDE,
            check_finished_run,
            finished_message,
            finished_run,
            set_aside_message,
        )
        from bertkit.training.run import is_main_process
        from bertkit.training.stop_and_resume import set_aside

        if _script_job is None and OmegaConf.select(config, "recipe.job") not in JOBS:
            return  # run_job names the bad job
        run_dir = Path(config.hydra.run.dir)
        try:
            action = check_finished_run(config, run_dir, job=_script_job)
        except BertkitError as err:
            exit_with_error(str(err))
        if action == FINISHED:
            message = finished_message(run_dir, finished_run(run_dir, _script_job),
                                       config.resume)
            print(mask_text(f"bertkit: {message}"), file=sys.stderr)
            sys.exit(0)
        if action == SET_ASIDE and is_main_process():
            folder = set_aside(run_dir)
            if folder is not None:
                print(mask_text(f"bertkit: {set_aside_message(run_dir, folder)}"),
                      file=sys.stderr)


class LaunchCheck(Callback):
    """hydra.callbacks.launch_settings (conf/config.yaml): a multirun's launcher and sweeper
    parameters (hydra.launcher.*, hydra.sweeper.*) held to their plugins' ranges and choices
    (bertkit.config_schema.check_launch) before Hydra instantiates either, which it does right
    after telling the callbacks the multirun starts: a refusal is bertkit's one line naming
    the key, exit status 2, where the plugin's own check (or its library's) ended in Hydra's
    "Error in call to target" lines, exit 1. It exits itself, as FinishedRunCheck."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        try:
            check_launch(config)
        except BertkitError as err:
            exit_with_error(str(err))


def failed_files(sweep_dir: Path) -> dict[Path, tuple[int, int, int]]:
    """Every failed.json under a sweep directory, with what tells a rewritten file from the
    one that was there (each is written anew, atomically: a new inode and time)."""
    found = {}
    for path in sweep_dir.rglob(FAILED_FILE) if sweep_dir.is_dir() else ():
        try:
            status = path.stat()
        except OSError:  # removed while the directory was walked
            continue
        found[path] = (status.st_ino, status.st_mtime_ns, status.st_size)
    return found


def failed_job_line(path: Path, sweep_dir: Path, launch_overrides: list[str]) -> str:
    """One failed job: its directory, the overrides it ran with beyond the command line's own
    (what was swept: the grid point, the seed, the trial), and the first line of its error."""
    try:
        record = json.loads(path.read_text())
        error = str(record["error"])
        overrides = [str(o) for o in record.get("overrides") or []]
    except (OSError, ValueError, KeyError, TypeError) as err:  # cut on a full disk
        error, overrides = f"{path} is unreadable ({type(err).__name__}: {err})", []
    lines = [line.strip() for line in error.splitlines() if line.strip()] or ["(no message)"]
    first = lines[0] + (" ..." if len(lines) > 1 else "")
    swept = [o for o in overrides if o not in launch_overrides] or overrides
    where = path.parent.relative_to(sweep_dir).as_posix()
    return mask_text(f"{where} [{' '.join(swept)}]: {first}" if swept else f"{where}: {first}")


class FailedJobsCheck(Callback):
    """hydra.callbacks.failed_jobs (conf/config.yaml): a multirun in which any job failed
    exits 1 after every job ran, printing each failed job with its one-line error; the other
    jobs' results stay where they are. Read in the launching process once the sweeper is done,
    from the failed.json files of the sweep directory, so it holds whichever launcher ran the
    jobs and wherever (this process, joblib's workers, gpu_pack's fresh processes, submitit)
    and whichever sweeper (basic, successive halving, Optuna). Only this launch's: the files
    that are new or rewritten since it started; a failed.json left by an earlier launch into
    the same directory is not this launch's failure. A preempted job writes none (it goes on
    from its checkpoint). It exits itself: Hydra turns an exception raised in a callback into
    a warning; listed first among hydra.callbacks, it is the last one told the multirun ended.
    """

    # The multirun under way in this process: a sweeper that raises after its jobs failed
    # (Optuna, when no trial finished) ends without on_multirun_end; main's error handler
    # still prints the failed jobs through it.
    launched: FailedJobsCheck | None = None

    def __init__(self) -> None:
        self.sweep_dir: Path | None = None
        self.launch_overrides: list[str] = []
        self.before: dict = {}

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        self.sweep_dir = Path(str(config.hydra.sweep.dir))
        # Masked as failed.json's are, so that a secret given once is not taken as swept.
        self.launch_overrides = [mask_text(str(o)) for o in config.hydra.overrides.task]
        self.before = failed_files(self.sweep_dir)
        FailedJobsCheck.launched = self

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        FailedJobsCheck.launched = None
        self.exit_if_any_failed()

    def exit_if_any_failed(self, sweeper_error: str | None = None) -> None:
        """Exit 1 with the summary when a job of this launch failed; else return."""
        if self.sweep_dir is None:
            return
        failed = sorted(path for path, stamp in failed_files(self.sweep_dir).items()
                        if self.before.get(path) != stamp)
        if not failed:
            return
        lines = [f"bertkit: {len(failed)} job(s) of this sweep failed (each one's failed.json "
                 f"says more); what finished is kept in {self.sweep_dir} (bertkit-report "
                 f"{self.sweep_dir}):"]
        lines += [f"  {failed_job_line(path, self.sweep_dir, self.launch_overrides)}"
                  for path in failed]
        if sweeper_error is not None:
            lines.append(mask_text(f"then the sweeper stopped: {sweeper_error}"))
        print("\n".join(lines), file=sys.stderr)
        sys.exit(1)


def composition_message(err: ConfigCompositionException) -> str | None:
    """One line naming the key for an override OmegaConf refused while Hydra composed the
    config (a word for a typed number, a key the schema lacks); None for Hydra's other errors
    (a missing config file, an override's syntax), whose messages list the options."""
    cause = err.__cause__
    if not isinstance(cause, OmegaConfBaseException) or not getattr(cause, "full_key", None):
        return None
    key = cause.full_key
    spec = composed_field(cause)
    if isinstance(cause, ValidationError) and spec is not None:
        expect = spec.metadata.get("expect")  # the field's own wording, as check_ranges says it
        return f"{key}={cause.value!r}: " + (f"expected {expect}" if expect
                                             else expected_type(spec))
    told = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
    return f"{told} ({str(cause).splitlines()[0]})"


def _one_line_errors(run_and_report):
    """Hydra's run_and_report, but an override refused at composition is bertkit's one line
    (exit status 2, as any BertkitError), not Hydra's four, and so is a BertkitError that a
    sweeper or launcher raises outside any job (hydra/launcher=gpu_pack's memory check), not
    a traceback. A sweeper that raises anything else once jobs failed (Optuna when no trial
    finished: "No trials are completed yet") ends with the failed jobs' summary and its error
    in one line, exit status 1. HYDRA_FULL_ERROR=1 keeps Hydra's."""
    def report(func):
        def composed():
            FailedJobsCheck.launched = None  # a launch of this command sets it
            try:
                return func()
            except Exception as err:
                launched, FailedJobsCheck.launched = FailedJobsCheck.launched, None
                if os.environ.get("HYDRA_FULL_ERROR") == "1":  # as Hydra reads it
                    raise
                message = (composition_message(err) if isinstance(err, ConfigCompositionException)
                           else str(err) if isinstance(err, BertkitError) else None)
                if message is not None:
                    exit_with_error(message)
                if launched is not None and not isinstance(err, ConfigCompositionException):
                    told = describe_failure(err).strip().splitlines() or [type(err).__name__]
                    launched.exit_if_any_failed(sweeper_error=told[0])
                raise
        return run_and_report(composed)
    return report


def main(job: Job | None = None, config_path: str | None = None,
         config_name: str = "config") -> None:
    """The `bertkit` command. A script of one's own runs its `job` on its own primary config
    (config_name in config_path, bertkit's conf/ and recipes/ on its search path) the same way:
    the same errors, secrets masking and run-directory checks."""
    global _script_job
    _script_job = job
    register_resolvers()
    # The command line's secrets are known before Hydra parses it, and what this process
    # prints is masked (secret_masking.masked_output): Hydra prints an override's syntax error
    # and a failed run's traceback itself, with sys.stderr.write and print(), before control
    # comes back here. Logs are masked at their making, before Hydra logs a sweep's jobs.
    remember_command_line(sys.argv[1:])
    mask_logs()
    # The one patch of a Hydra internal (1.3's hydra._internal.utils.run_and_report), kept
    # because no public hook sees these errors: Hydra calls run_and_report around composing
    # the config and around the whole run or sweep, and it prints any exception raised there
    # (Hydra's lines, or a traceback) and exits 1 before control comes back to this function;
    # callbacks are told of neither a failed composition nor a sweeper's error (their own
    # exceptions are turned into warnings). Composing the command line's overrides first with
    # the public Compose API would catch a single run's bad override only: a sweep composes
    # each job's config inside the launcher (trainer.learning_rate=1e-5,fast: its second
    # job), a sweeper raises its error after the jobs ran, a launcher its own before them.
    # The one-line messages are tested through the command (tests/test_config_bounds.py,
    # tests/sweeps/); a Hydra without run_and_report keeps its own.
    reporter = getattr(hydra_utils, "run_and_report", None)
    if reporter is not None and not getattr(reporter, "bertkit", False):
        hydra_utils.run_and_report = _one_line_errors(hydra_utils.run_and_report)
        hydra_utils.run_and_report.bertkit = True
    with masked_output():
        hydra.main(config_path=config_path or config_dir(), config_name=config_name,
                   version_base="1.3")(_hydra_task)()


if __name__ == "__main__":
    main()
