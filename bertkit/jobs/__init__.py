"""One function that runs any bertkit job from its composed config: what `bertkit` calls, and
what tests and notebooks call with a config of their own (the lightning-hydra-template's pure
`train(cfg)`).

recipe.job picks the job: finetune (the task family of task.family, through the one
finetune job, bertkit.training.finetune; two_stage.py when finetuning.intermediate.task is
set) or pretrain (bertkit.pretraining.run). A script of one's own runs its job (a Job of its
own, passed as `job`) through the same steps. Sits above the families: nothing below imports
it.

A directory that holds a finished run (the result file some job writes when it is done) is
never written into by a new job unless asked (check_finished_run): run_job makes the check
after the settings-only checks, before anything is read or written; bertkit.cli makes it
before Hydra writes too. overwrite=true sets the earlier run aside first (nothing of it is
left for a later step to read) and removes it once the new run has started
(bertkit.training.stop_and_resume.set_aside); resume=true|auto on a finished run leaves it as it
is and returns its result.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from pkgutil import resolve_name as imported

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from bertkit.config_paths import config_dir
from bertkit.config_schema import checked_once
from bertkit.data.atomic_files import read_json
from bertkit.data.metrics_file import FAILED_FILE, METRICS_FILE
from bertkit.data.task_data import use_hub_settings
from bertkit.errors import BertkitError
from bertkit.jobs.two_stage import finetune_two_stage
from bertkit.tasks import task_family
from bertkit.training.finetune import finetune
from bertkit.training.models import check_local_files, offline_ways
from bertkit.training.run import (
    CHECKPOINTS_DIR,
    apply_progress_bars,
    hydra_run_dir,
    is_main_process,
)
from bertkit.training.stop_and_resume import (
    checkpoint_folders,
    forget_set_aside,
    remove_set_aside,
    set_aside,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Job:
    """A job of recipe.job (or a script's own, given to run_job), and how its run directory
    says it is finished."""

    entry: str | None  # "module:function(cfg, run_dir)"; None: finetune (run_job's own dispatch)
    result_file: str  # written when the job is done: its directory then holds a finished run
    resumes: bool = False  # resume=true continues a finished run from its newest checkpoint
    # Relaunched into its own finished run, it reuses what is done (seeds, arms) and adds what
    # is missing, so that relaunch is let through.
    reuses_its_runs: bool = False


# recipe.job -> the job.
JOBS = {
    "finetune": Job(None, METRICS_FILE, resumes=True),
    "pretrain": Job("bertkit.pretraining.run:pretrain", METRICS_FILE, resumes=True),
}
RESULT_FILES = tuple(dict.fromkeys(job.result_file for job in JOBS.values()))


def job_of(cfg: DictConfig, job: Job | None = None) -> Job:
    """The job a config runs: `job` when a script gives its own, else recipe.job's."""
    return job if job is not None else JOBS[cfg.recipe.job]


def result_files(job: Job | None = None) -> tuple[str, ...]:
    """The files that make a directory a finished run: every job's of JOBS, and `job`'s."""
    return RESULT_FILES if job is None else tuple(dict.fromkeys((*RESULT_FILES, job.result_file)))


def finished_run(run_dir: Path, job: Job | None = None) -> str | None:
    """The result file that makes run_dir a finished run (of any job, or `job`), or None."""
    return next((name for name in result_files(job) if (Path(run_dir) / name).is_file()), None)


# What a new job does with what its run directory holds (check_finished_run's answer).
START = None  # start there (nothing there, or resume continues an unfinished run)
SET_ASIDE = "set_aside"  # overwrite=true: the earlier run is set aside first
FINISHED = "finished"  # resume=true|auto on a finished run: nothing is left to do
# What makes a directory an earlier run's, for overwrite=true (a directory of a user's that
# holds none of these is written into as it is): a result file, a failure, checkpoints, or
# the .hydra/ folder of a launch.
HYDRA_DIR = ".hydra"
RUN_MARKERS = frozenset({*RESULT_FILES, FAILED_FILE, CHECKPOINTS_DIR, HYDRA_DIR})


def check_finished_run(cfg: DictConfig, run_dir: Path, keep: frozenset[str] = frozenset(),
                       job: Job | None = None) -> str | None:
    """What a job started in run_dir does with what is there (`keep`: the entries a sweep
    job's Hydra has just written, not an earlier run's):

    - START (None): nothing is there, or resume=true|auto continues an unfinished run (a run
      preempted, failed, or cut by train_fraction and set aside by successive halving), or
      the job reuses its own finished runs;
    - SET_ASIDE: overwrite=true and an earlier run is there, finished or not (with resume
      true|auto, only a finished one: an unfinished run is continued);
    - FINISHED: resume=true|auto for a job that resumes, and its run is finished for the
      schedule asked (extends_schedule): nothing is left to do. A longer schedule than the
      finished run's (a larger trainer.max_steps, say) continues it from its newest
      checkpoint: START; refused when the run kept none (keep_checkpoints=false).

    Refuses a finished run otherwise, in one line naming the run and the ways on, and
    overwrite=true with resume=true on a finished run (the two ask opposite things)."""
    job = job_of(cfg, job)
    found = finished_run(run_dir, job)
    overwrite, resume = cfg.overwrite is True, cfg.resume
    resuming = job.resumes and resume in (True, "auto")
    if found is None:
        return SET_ASIDE if overwrite and not resuming and holds_earlier_run(run_dir, keep, job) \
            else START
    if overwrite and resuming and resume is True:
        raise BertkitError(f"{run_dir} holds a finished run ({found}): resume=true leaves it as "
                           f"it is and overwrite=true writes over it: give one of them")
    if overwrite:
        return SET_ASIDE
    if resuming:
        cut_short = found == METRICS_FILE and stopped_by_train_fraction(run_dir / found)
        if cut_short:
            return START
        if not extends_schedule(cfg, run_dir):
            return FINISHED
        if not holds_checkpoints(run_dir):
            raise BertkitError(
                f"{run_dir} holds a finished run ({found}) and no checkpoint to train it on "
                f"from: a finished run keeps its checkpoints only with keep_checkpoints=true; "
                f"give overwrite=true to train it anew with this schedule")
        return START
    if job.reuses_its_runs and found == job.result_file:
        return START
    sweep = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    ways = [f"{'hydra.sweep.dir' if sweep else 'hydra.run.dir'}=<another directory>",
            *(["resume=true with a longer schedule (trainer.max_steps, "
               "trainer.num_train_epochs or budget.minutes) to train it on"]
              if job.resumes and holds_checkpoints(run_dir) else []),
            "overwrite=true to write over it"]
    raise BertkitError(f"{run_dir} holds a finished run ({found}): give "
                       f"{', '.join(ways[:-1])}, or {ways[-1]}")


# The settings that say how long a run trains: a finished run resumed with a longer schedule
# (each of these as long or longer, one longer) is continued to the new end.
SCHEDULE_KEYS = ("trainer.max_steps", "trainer.num_train_epochs", "budget.minutes")
RUN_CONFIG_FILE = "config.yaml"  # the run's resolved settings (bertkit.training.run)


def holds_checkpoints(run_dir: Path) -> bool:
    """Whether run_dir holds a checkpoint that a longer schedule could train on from (a
    finished run keeps them only with keep_checkpoints=true)."""
    return bool(checkpoint_folders(Path(run_dir) / CHECKPOINTS_DIR))


def stopped_by_train_fraction(metrics_file: Path) -> bool:
    """Whether a metrics.json records a run that train_fraction stopped before the end of its
    schedule (train.complete false): resume=true continues it (successive halving's rungs)."""
    try:
        record = read_json(metrics_file, expect=dict)
    except BertkitError:
        return False
    train = record.get("train")
    return isinstance(train, dict) and train.get("complete") is False


def extends_schedule(cfg: DictConfig, run_dir: Path) -> bool:
    """Whether cfg asks a finished run in run_dir to train longer than it did: its schedule
    (SCHEDULE_KEYS) differs from the run's config.yaml and is nowhere shorter. A run whose
    config.yaml is missing or unreadable is taken as finished for any schedule."""
    try:
        finished = OmegaConf.load(Path(run_dir) / RUN_CONFIG_FILE)
    except Exception:  # noqa: BLE001 - missing, cut or not YAML: nothing to compare with
        return False
    longer = False
    for key in SCHEDULE_KEYS:
        old, new = (OmegaConf.select(node, key) for node in (finished, cfg))
        if old == new:
            continue
        numbers = all(isinstance(value, (int, float)) and not isinstance(value, bool)
                      and value > 0 for value in (old, new))
        if not numbers or new < old:  # another kind of schedule, or a shorter one
            return False
        longer = True
    return longer


def holds_earlier_run(run_dir: Path, keep: frozenset[str] = frozenset(),
                      job: Job | None = None) -> bool:
    """Whether run_dir, but `keep`, holds anything that only a run leaves (RUN_MARKERS, and
    `job`'s result file)."""
    run_dir = Path(run_dir)
    names = {path.name for path in run_dir.iterdir()} if run_dir.is_dir() else set()
    markers = RUN_MARKERS if job is None else RUN_MARKERS | {job.result_file}
    return bool((names - keep) & markers)


def finished_message(run_dir: Path, found: str, resume) -> str:
    """The one line resume=true|auto says on a finished run."""
    return (f"{run_dir} holds a finished run ({found}): resume={str(resume).lower()} has "
            f"nothing left to do, the run is left as it is")


def set_aside_message(run_dir: Path, folder: Path) -> str:
    return (f"overwrite=true: the earlier run in {run_dir} is set aside in {folder}, and removed "
            f"once this run's training begins")


def launch_files(run_dir: Path) -> frozenset[str]:
    """What Hydra wrote into run_dir for this job before any bertkit code ran (its .hydra/
    folder and the log file it opened), when run_dir is the job's Hydra output directory;
    else nothing."""
    if not HydraConfig.initialized():
        return frozenset()
    hydra_cfg = HydraConfig.get()
    output_dir = OmegaConf.select(hydra_cfg, "runtime.output_dir")  # ??? outside a launch
    if output_dir is None or Path(output_dir).resolve() != Path(run_dir).resolve():
        return frozenset()
    names = {str(hydra_cfg.output_subdir)} if hydra_cfg.output_subdir is not None else set()
    for handler in logging.getLogger().handlers:
        path = Path(getattr(handler, "baseFilename", "") or "")
        if path.parent.resolve() == Path(run_dir).resolve():
            names.add(path.name)
    return frozenset(names)


def check_task_family(recipe: DictConfig | None, task: DictConfig | None) -> None:
    """recipe=glue with task=squad_v1 would train SQuAD with GLUE's settings: refused (the
    recipe and task nodes; None where the config has none, as a pretraining config's task)."""
    wanted = None if recipe is None else OmegaConf.select(recipe, "task_family")
    family = None if task is None else OmegaConf.select(task, "family")
    if wanted is not None and family != wanted:
        raise BertkitError(
            f"task={task.name} is a {family} task, but recipe={recipe.name} runs "
            f"{wanted} tasks: pick a task of conf/task/ with family {wanted}, or "
            f"recipe={family}")


def run_job(cfg: DictConfig, run_dir: Path | None = None, job: Job | None = None) -> dict:
    """The job's result record (a finetune's is its metrics.json). `job`: a script's own job,
    run in place of recipe.job's, through the same checks."""
    name = check_job(cfg.recipe, OmegaConf.select(cfg, "task"), known=job is None)
    # The schemas (bertkit.config_schema), once for the whole job: finetune and
    # check_pretraining_config do not check this config again.
    with checked_once(cfg):
        finished = prepare_job(cfg, run_dir, job)
        if finished is not None:
            return finished
        try:
            result = _run(name, cfg, run_dir) if job is None \
                else imported(job.entry)(cfg, run_dir)
        except BaseException:
            forget_set_aside()  # kept where the line said: the new run did not start
            raise
        remove_set_aside()  # a job that trained nothing in this process: it has finished
        return result


def _run(job: str, cfg: DictConfig, run_dir: Path | None) -> dict:
    if job == "finetune" and cfg.finetuning.intermediate.task is not None:  # STILTs
        return finetune_two_stage(cfg, run_dir or hydra_run_dir())
    if job == "finetune":
        return finetune(cfg, task_family(cfg.task.family), run_dir)
    return imported(JOBS[job].entry)(cfg, run_dir)


def check_job(recipe: DictConfig, task: DictConfig | None, known: bool = True) -> str:
    """recipe.job, known (unless a script runs its own job); the task of the recipe's family
    (first: another family's task leaves the recipe's ${task.*} unset, and the schema's check
    would stumble on it)."""
    if known and recipe.job not in JOBS:
        raise BertkitError(f"recipe.job={recipe.job!r}: expected {', '.join(JOBS)}")
    check_task_family(recipe, task)
    return recipe.job


def prepare_job(cfg: DictConfig, run_dir: Path | None, job: Job | None = None) -> dict | None:
    """Before anything is read or written (the checks before only read the settings): a
    finished run in run_dir refused, or, with resume=true|auto, its result returned (not
    None: nothing is left to do), or with overwrite=true the earlier run set aside; a
    fetched-only model present, the progress bars decided once for the job."""
    run_dir = Path(run_dir or hydra_run_dir())
    keep = launch_files(run_dir)
    action = check_finished_run(cfg, run_dir, keep, job)
    if action == FINISHED:
        found = finished_run(run_dir, job)
        logger.warning(finished_message(run_dir, found, cfg.resume))
        return read_json(run_dir / found, expect=dict)
    if action == SET_ASIDE and is_main_process():
        folder = set_aside(run_dir, keep)
        if folder is not None:
            logger.warning(set_aside_message(run_dir, folder))
    # Whether the Hub can be reached is checked at its first use (bertkit.data.task_data).
    use_hub_settings(cfg.hub_check_seconds,
                     lambda: offline_ways(config_dir()))
    check_local_files(cfg.model, fetched_only=True)  # model=minilm_l6: make minilm
    apply_progress_bars(cfg)  # bars on a terminal only (auto)
    return None
