"""A Hydra sweeper that runs a grid by successive halving (bertkit.sweeps.halving).

It expands the grid exactly as Hydra's basic sweeper does (sweeper params, narrowed or widened
by the command line), then launches rung after rung through whatever launcher is configured,
so it works with Hydra's basic launcher and with parallel ones alike. Each job is told its
share of the schedule (train_fraction=...) and, from the second rung on, to continue from its
checkpoint (resume=true); it ranks jobs by the main dev metric they return to Hydra, and reads
their metrics.json for the compute accounting.
"""

# No `from __future__ import annotations`: Hydra loads plugin modules outside sys.modules,
# where dataclasses cannot resolve string annotations, and OmegaConf reads these types.
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional  # noqa: UP035 - OmegaConf structured config types

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobStatus
from hydra.plugins.sweeper import Sweeper
from omegaconf import DictConfig, OmegaConf

from bertkit.data.atomic_files import write_json_atomic, write_text_atomic
from bertkit.data.job_overrides import configuration_of
from bertkit.errors import BertkitError
from bertkit.secret_masking import mask_secrets

log = logging.getLogger("bertkit")


def halving():
    """bertkit.sweeps.halving (the rungs, the ledger, the survivors), imported when a sweep
    starts, not with the plugin: Hydra imports every plugin at each start of `bertkit`, --help
    too, and the rungs' readers bring pyarrow (about half a second)."""
    import bertkit.sweeps.halving

    return bertkit.sweeps.halving


# A parameter's range ("interval", as bertkit.config_schema writes them) and the message's
# wording ("expect"): checked before Hydra instantiates the sweeper (check_launch).
@dataclass
class SuccessiveHalvingSweeperConf:
    _target_: str = (
        "hydra_plugins.bertkit_halving_sweeper.halving_sweeper.SuccessiveHalvingSweeper")
    # The grid searched (as Hydra's basic sweeper takes it); other keys swept on the command
    # line (task=rte,mrpc) form separate brackets, replicate keys are averaged over.
    params: Optional[Dict[str, str]] = None  # noqa: UP006, UP045
    # After each rung the best 1/eta configurations of a bracket go on.
    eta: float = field(default=2.0, metadata={
        "interval": "(1, inf)",
        "expect": "a number above 1 (the best 1/eta of the configurations go on after each "
                  "rung)"})
    # Share of each job's schedule trained in the first rung; it grows eta-fold per rung.
    min_fraction: float = field(default=0.25, metadata={
        "interval": "(0, 1]", "expect": "a share of the schedule in (0, 1]"})
    replicate_keys: List[str] = field(default_factory=lambda: ["seed"])  # noqa: UP006
    greater_is_better: bool = True
    # Deleted from a job's directory once it is stopped (its scores stay): [] keeps them.
    delete_when_stopped: List[str] = field(  # noqa: UP006
        default_factory=lambda: ["checkpoints", "model"])


ConfigStore.instance().store(group="hydra/sweeper", name="bertkit_halving",
                             node=SuccessiveHalvingSweeperConf, provider="bertkit")


class SuccessiveHalvingSweeper(Sweeper):
    def __init__(self, params: dict[str, str] | None, eta: float, min_fraction: float,
                 replicate_keys: list[str], greater_is_better: bool,
                 delete_when_stopped: list[str]) -> None:
        super().__init__()
        self.params = dict(params or {})
        self.eta = float(eta)
        self.fractions = halving().rung_fractions(float(min_fraction), self.eta)
        self.replicate_keys = list(replicate_keys)
        self.greater_is_better = greater_is_better
        self.delete_when_stopped = list(delete_when_stopped)
        self.config: DictConfig | None = None
        self.launcher = None
        self.hydra_context = None

    def setup(self, *, hydra_context, task_function, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        self.hydra_context = hydra_context
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config)

    def grid(self, arguments: list[str]) -> list[tuple[str, ...]]:
        """Every job's overrides: the cartesian product, as the basic sweeper makes it."""
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        overrides = parser.parse_overrides([*(f"{k}={v}" for k, v in self.params.items()),
                                            *arguments])
        (batch,) = BasicSweeper.split_arguments(overrides, max_batch_size=None)
        return [tuple(job) for job in batch]

    def sweep(self, arguments: list[str]) -> Any:
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(sweep_dir / "multirun.yaml",
                          OmegaConf.to_yaml(OmegaConf.create(mask_secrets(self.config))))
        jobs = self.grid(arguments)
        searched = [key.lstrip("+~") for key in self.params]
        configuration = {job: configuration_of(job, self.replicate_keys) for job in jobs}
        bracket = {job: halving().bracket_of(job, searched, self.replicate_keys) for job in jobs}
        ledger = halving().HalvingLedger(self.fractions, self.eta)
        run_dirs: dict[tuple[str, ...], Path] = {}
        alive = list(jobs)
        started, next_job_num, returns = time.perf_counter(), 0, []
        for rung, fraction in enumerate(self.fractions):
            if rung > 0:
                for job in alive:
                    halving().set_aside_rung_result(run_dirs[job], rung - 1)
            extra = [f"train_fraction={fraction}"] + (["resume=true"] if rung > 0 else [])
            batch = [[*job, *extra] for job in alive]
            log.info("successive halving, rung %d: %d jobs train to %.0f%% of their schedule",
                     rung, len(batch), 100 * fraction)
            self.validate_batch_is_legal(batch)
            results = self.launcher.launch(batch, initial_job_idx=next_job_num)
            next_job_num += len(batch)
            returns.append(results)
            outcomes = {}
            for job, result in zip(alive, results, strict=True):
                run_dir = Path(result.hydra_cfg.hydra.runtime.output_dir)
                if run_dirs.setdefault(job, run_dir) != run_dir:
                    raise BertkitError(
                        f"job {' '.join(job)} ran in {run_dir} in rung {rung} but in "
                        f"{run_dirs[job]} before: hydra.sweep.subdir must name each job by "
                        f"its overrides (as sweep=paper_grid_halving does), not by job number")
                outcomes[job] = (halving().read_outcome(run_dir, result.return_value)
                                 if result.status == JobStatus.COMPLETED
                                 else halving().JobOutcome(run_dir, None,
                                                 error=repr(result._return_value)))
            if rung == 0:
                self._check_distinct_dirs(run_dirs)
            kept = self._decide(alive, outcomes, configuration, bracket, last=(
                rung == len(self.fractions) - 1))
            ledger.record_rung(rung, outcomes, configuration, bracket, kept)
            if ledger.rungs[-1]["cut_by_grid_order"]:
                log.warning("successive halving, rung %d: configurations with equal scores "
                            "were cut by grid order, not by merit (every score tied, e.g. "
                            "nothing learned yet): widen the grid or the first rung", rung)
            stopped = [job for job in alive if configuration[job] not in kept]
            for job in stopped:
                halving().delete_weights(run_dirs[job], self.delete_when_stopped)
            alive = [job for job in alive if configuration[job] in kept]
            summary = {**ledger.as_dict(), "wall_seconds": round(time.perf_counter() - started, 2)}
            write_json_atomic(sweep_dir / "halving.json", mask_secrets(summary))
        compute = ledger.compute()
        if compute["saved_fraction"] is not None:
            log.info("successive halving: %d of %d training examples of the full grid "
                     "(%.0f%% saved); %s", compute["examples_trained"],
                     compute["examples_full_grid"], 100 * compute["saved_fraction"],
                     sweep_dir / "halving.json")
        return returns

    def _decide(self, alive, outcomes, configuration, bracket, last: bool) -> set:
        """The configurations that go on (after the last rung: the finished ones)."""
        by_bracket: dict[tuple, dict[tuple, list]] = {}
        for job in alive:
            scores = by_bracket.setdefault(bracket[job], {}).setdefault(configuration[job], [])
            scores.append(outcomes[job].score)
        if last:
            return {config for scores in by_bracket.values() for config, values in
                    scores.items() if any(v is not None for v in values)}
        kept = set()
        for scores in by_bracket.values():
            kept.update(halving().survivors(scores, self.eta, self.greater_is_better))
        return kept

    @staticmethod
    def _check_distinct_dirs(run_dirs: dict) -> None:
        seen: dict[Path, tuple] = {}
        for job, run_dir in run_dirs.items():
            if run_dir in seen:
                raise BertkitError(
                    f"jobs {' '.join(seen[run_dir])} and {' '.join(job)} share the directory "
                    f"{run_dir}: successive halving continues each job from its own "
                    f"checkpoint, so hydra.sweep.subdir must tell every job apart")
            seen[run_dir] = job
