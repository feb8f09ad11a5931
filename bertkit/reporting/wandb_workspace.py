"""A W&B workspace for a sweep, built with W&B's own wandb-workspaces from what the sweep's runs
logged (the W&B run logs under the sweep directory, read without W&B's service).

The runs are filtered to the sweep's W&B groups and its sweep tag when every run has one (a
multirun's sweep:<id>, one launch's and no other's), and grouped by W&B group (in a multirun,
one configuration of it) and grid point, so that the seeds of one grid point are one line or
bar, their mean with a standard-deviation band. The panels (wandb_workspace.yaml) are those
whose keys the runs logged, the curves against the layout's x_axis (Trainer's global step).
Offline, the workspace's view (what wandb-workspaces sends to W&B on save) is written as JSON;
online, it is also saved to ENTITY/PROJECT.
"""

from __future__ import annotations

import fnmatch
import os
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bertkit.errors import BertkitError
from bertkit.reporting.wandb_log import read_offline_run
from bertkit.reporting.wandb_runs import is_wandb_run_dir, select_dotted
from bertkit.wandb_credentials import has_wandb_credentials

LAYOUT_FILE = Path(__file__).with_name("wandb_workspace.yaml")
WORKSPACE_FILE = "wandb_workspace.json"
SWEEP_TAG_PREFIX = "sweep:"
PANEL_KINDS = ("line", "bar")


@dataclass
class LoggedSweep:
    """What a sweep's runs logged, over all of them."""

    runs: int = 0
    groups: set[str] = field(default_factory=set)
    projects: set[str] = field(default_factory=set)
    jobs: set[str] = field(default_factory=set)
    sweep_tags: list[set[str]] = field(default_factory=list)  # each run's sweep:<tag> tags
    history_keys: set[str] = field(default_factory=set)
    summary_keys: set[str] = field(default_factory=set)
    configs: list[dict] = field(default_factory=list)

    def config_values(self, dotted: str) -> list:
        """Each run's value of a config key (dotted into nested dicts); runs without it (or
        with null) left out."""
        return [value for config in self.configs
                if (value := select_dotted(config, dotted)) is not None]

    @property
    def sweep_tag(self) -> str | None:
        """The sweep:<tag> every run carries, if there is exactly one such."""
        shared = set.intersection(*self.sweep_tags) if self.sweep_tags else set()
        return next(iter(shared)) if len(shared) == 1 else None


def read_sweep(root: Path) -> LoggedSweep:
    """Every bertkit run whose W&B log is under root (offline runs, or synced runs' local
    copies)."""
    root = Path(root)
    if not root.is_dir():
        raise BertkitError(f"{root}: not a directory (give the sweep's output directory)")
    sweep = LoggedSweep()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        if not is_wandb_run_dir(Path(dirpath), filenames):
            continue
        log = read_offline_run(Path(dirpath))
        bertkit = log["config"].get("bertkit")
        if not log["has_run_record"] or not isinstance(bertkit, dict):
            continue  # a job that stopped as it started, or not a run of bertkit's
        sweep.runs += 1
        sweep.groups.add(str(log["group"]))
        sweep.projects.add(str(select_dotted(bertkit, "logger.project")))
        sweep.jobs.add(str(select_dotted(bertkit, "recipe.job")))
        sweep.sweep_tags.append({tag for tag in log["tags"] if tag.startswith(SWEEP_TAG_PREFIX)})
        sweep.history_keys |= log["history_keys"]
        sweep.summary_keys |= set(log["summary"])
        sweep.configs.append(log["config"])
    if not sweep.runs:
        raise BertkitError(f"{root}: no W&B run logs of bertkit runs found (wandb/offline-run-*/"
                           f"run-*.wandb); run the sweep with logger=wandb (offline is enough)")
    return sweep


def load_layout(path: Path | None = None) -> dict:
    path = Path(path or LAYOUT_FILE)
    try:
        layout = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise BertkitError(f"{path}: cannot read the workspace layout ({err})") from None
    for required in ("grid_keys", "aggregate", "band", "max_runs", "x_axis",
                     "parallel_coordinates", "sections"):
        if not isinstance(layout, dict) or required not in layout:
            raise BertkitError(f"{path}: the workspace layout has no '{required}'")
    for section in layout["sections"]:
        for panel in section.get("panels", []):
            if panel.get("kind") not in PANEL_KINDS or not panel.get("title"):
                raise BertkitError(f"{path}: section {section.get('name')!r}: panel {panel!r} "
                                   f"needs a title and kind one of {', '.join(PANEL_KINDS)}")
    return layout


def parse_target(target: str) -> tuple[str, str]:
    """ENTITY/PROJECT."""
    parts = target.split("/")
    if len(parts) != 2 or not all(parts):
        raise BertkitError(f"--wandb-workspace {target!r}: expected ENTITY/PROJECT "
                           f"(e.g. my-team/bertkit)")
    return parts[0], parts[1]


@dataclass
class WorkspacePlan:
    """What the workspace shows, decided from the logged keys before wandb-workspaces builds
    it: testable without W&B's classes."""

    entity: str
    project: str
    name: str
    groups: list[str]
    sweep_tag: str | None
    grid_keys: list[str]
    parallel_config: list[str]
    parallel_summary: list[str]
    sections: list[dict]  # {"name", "panels": [{"title", "kind", "keys"}]}
    left_out: list[str]  # panel titles none of whose keys were logged
    aggregate: str
    band: str
    max_runs: int
    x_axis: str  # the history key the line plots are drawn against


def plan_workspace(sweep: LoggedSweep, entity: str, project: str, name: str | None = None,
                   layout: dict | None = None) -> WorkspacePlan:
    layout = layout or load_layout()
    if sweep.projects != {project}:
        raise BertkitError(f"--wandb-workspace .../{project}: the sweep's runs logged to W&B "
                           f"project(s) {', '.join(sorted(sweep.projects))} "
                           f"(logger.project): a workspace in {project} would show none of them")
    has = lambda key: bool(sweep.config_values(key))  # noqa: E731
    grid = [key for key in layout["grid_keys"] if has(key)]
    sections, left_out = [], []
    for section in layout["sections"]:
        panels = []
        for panel in section.get("panels", []):
            logged = sweep.history_keys if panel["kind"] == "line" else sweep.summary_keys
            patterns = panel.get("history" if panel["kind"] == "line" else "summary", [])
            keys = sorted({key for key in logged for pattern in patterns
                           if fnmatch.fnmatchcase(key, pattern)})
            if keys:
                panels.append({"title": panel["title"], "kind": panel["kind"], "keys": keys})
            else:
                left_out.append(f"{section['name']} / {panel['title']}")
        if panels:
            sections.append({"name": section["name"], "panels": panels})
    groups = sorted(sweep.groups)
    parallel = layout["parallel_coordinates"]
    selected = (sweep.sweep_tag.removeprefix(SWEEP_TAG_PREFIX) if sweep.sweep_tag
                else ", ".join(groups))
    return WorkspacePlan(
        entity=entity, project=project, name=name or f"bertkit: {plain_name(selected)}",
        groups=groups, sweep_tag=sweep.sweep_tag, grid_keys=grid,
        parallel_config=[key for key in parallel["config"] if has(key)],
        parallel_summary=[key for key in parallel["summary"] if key in sweep.summary_keys],
        sections=sections, left_out=left_out, aggregate=layout["aggregate"],
        band=layout["band"], max_runs=int(layout["max_runs"]), x_axis=str(layout["x_axis"]))


def plain_name(text: str) -> str:
    """text without the symbols wandb-workspaces refuses in a workspace's name (its
    validate_no_emoji refuses every symbol, "=" and "+" among them)."""
    return "".join(char for char in text
                   if not unicodedata.category(char).startswith(("S", "Cs")))


def build_workspace(plan: WorkspacePlan):
    """The wandb-workspaces Workspace of the plan."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws
    from wandb_workspaces import expr

    grouped = {"groupby_aggfunc": plan.aggregate, "groupby_rangefunc": plan.band}
    sections = []
    if plan.parallel_config or plan.parallel_summary:
        columns = [wr.ParallelCoordinatesPlotColumn(metric=wr.Config(key))
                   for key in plan.parallel_config]
        columns += [wr.ParallelCoordinatesPlotColumn(metric=wr.SummaryMetric(key))
                    for key in plan.parallel_summary]
        sections.append(ws.Section(name="Grid", is_open=True, panels=[
            wr.ParallelCoordinatesPlot(title="grid: hyperparameters and dev score",
                                       columns=columns)]))
    for section in plan.sections:
        panels = []
        for panel in section["panels"]:
            if panel["kind"] == "line":
                panels.append(wr.LinePlot(title=panel["title"], x=plan.x_axis,
                                          y=panel["keys"], **grouped))
            else:
                panels.append(wr.BarPlot(title=panel["title"], **grouped,
                                         metrics=[wr.SummaryMetric(k) for k in panel["keys"]]))
        sections.append(ws.Section(name=section["name"], is_open=True, panels=panels))
    filters = [expr.Metric("group").isin(plan.groups)]
    if plan.sweep_tag:
        filters.append(expr.Tags().isin([plan.sweep_tag]))
    groupby = [expr.Metric("group"), *(expr.Config(key) for key in plan.grid_keys)]
    return ws.Workspace(
        entity=plan.entity, project=plan.project, name=plan.name, sections=sections,
        settings=ws.WorkspaceSettings(max_runs=plan.max_runs, x_axis=plan.x_axis),
        runset_settings=ws.RunsetSettings(filters=filters, groupby=groupby))


def workspace_view(workspace) -> dict:
    """The view wandb-workspaces sends to W&B when the workspace is saved (Workspace.save
    upserts exactly this): the dry run's spec. The library has no public dry run, so its
    _to_model(), which save() itself calls, is the one private call here."""
    return workspace._to_model().model_dump(by_alias=True, exclude_none=True, mode="json")


def save_workspace(workspace) -> str:
    """Saves to W&B (needs credentials and the network); returns the workspace's URL."""
    if not has_wandb_credentials():
        raise BertkitError("--wandb-workspace: no W&B credentials (WANDB_API_KEY or `wandb "
                           "login`); add --dry-run to write the workspace's spec only")
    try:
        return workspace.save().url
    except Exception as err:  # wandb's GraphQL client raises many kinds; one message here
        raise BertkitError(f"--wandb-workspace: W&B refused or could not be reached "
                           f"({type(err).__name__}: {err}); --dry-run writes the spec "
                           f"offline") from None
