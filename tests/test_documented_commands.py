"""Every command the docs show works as written, as far as it can without data or a GPU:
each `bertkit ...` composes with Hydra as `bertkit ... --cfg job` would (a multirun's sweeps
parse, and each alternative of a swept config group composes) and passes the checks a job
makes before it reads anything; each `python -m benchmarks.<module> ...` composes that
benchmark's config (benchmarks.command) and passes the same checks and the benchmarks' own;
each `bertkit-report ...` parses; each `make ...` names a target, and the bertkit commands it
would run (`make --dry-run`) compose too.

A new page or command is picked up by itself (tests/doc_commands.py reads them); a
placeholder the docs start using has to be listed there."""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import io
import os
import shutil
import subprocess

import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.config_repository import ConfigRepository
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from benchmarks.command import compose_config as compose_benchmark
from benchmarks.settings import check_settings
from bertkit.cli import register_resolvers
from bertkit.config_schema import check_ranges
from bertkit.config_tree import config_dir
from bertkit.jobs import check_task_family
from bertkit.reporting.cli import parse_args as parse_report_args
from tests.doc_commands import REPO, Command, commands_in, documented_commands

COMMANDS = documented_commands()
PARSER = OverridesParser.create()
_ABSENT = object()


@pytest.fixture(scope="module", autouse=True)
def config_tree():
    """One Hydra initialisation for all compositions, through the CLI's own config dir; each
    config file is read once (Hydra reads every file again for each composition, which made
    this test take minutes), and handed out as a copy, as a fresh read would be."""
    register_resolvers()
    read, files = ConfigRepository.load_config, {}

    def read_once(repository, config_path):
        # By path alone: each composition reads through a fresh copy of the repository.
        if config_path not in files:
            files[config_path] = read(repository, config_path)
        return copy.deepcopy(files[config_path])

    with pytest.MonkeyPatch.context() as patch, \
            initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        patch.setattr(ConfigRepository, "load_config", read_once)
        yield


def _first_line(err: BaseException) -> str:
    text = (str(err).strip() or type(err).__name__).splitlines()[0]
    if err.__cause__ is not None:
        text += f" ({_first_line(err.__cause__)})"
    return text


def _is_group(override) -> bool:
    """A config group's choice (task=rte), as Hydra's defaults list tells them from values."""
    repository = GlobalHydra.instance().hydra.config_loader.repository
    return not isinstance(override.value(), dict) and repository.group_exists(
        override.key_or_group)


@functools.cache
def _composed_tree(choices: tuple[str, ...]) -> tuple[str | None, DictConfig | None]:
    try:
        return None, compose(config_name="config", overrides=list(choices),
                             return_hydra_config=True)
    except Exception as err:  # noqa: BLE001 - any failure is the finding, reported by its message
        return f"{type(err).__name__}: {_first_line(err)}", None


@functools.cache
def _composed(overrides: tuple[str, ...]) -> tuple[str | None, DictConfig | None]:
    """(problem, config): what `bertkit <overrides> --cfg job` composes, then the job's own
    settings checks (run_job's first steps, before it reads anything).

    Hydra's own two steps, with the first one shared: the defaults tree composed from the
    group choices (cached: many commands pick the same groups), then the values set on it by
    Hydra's own override code, as compose() does after the tree (a whole compose per command
    would take minutes)."""
    try:
        parsed = PARSER.parse_overrides(list(overrides))
        ConfigLoaderImpl.validate_sweep_overrides_legal(parsed, RunMode.RUN, from_shell=True)
        problem, tree = _composed_tree(tuple(o.input_line for o in parsed if _is_group(o)))
        if problem:
            return problem, None
        cfg = copy.deepcopy(tree)
        ConfigLoaderImpl._apply_overrides_to_config(
            [o for o in parsed if not _is_group(o)], cfg)
        check_task_family(OmegaConf.select(cfg, "recipe"), OmegaConf.select(cfg, "task"))
        check_ranges(cfg)
    except Exception as err:  # noqa: BLE001
        return f"{type(err).__name__}: {_first_line(err)}", None
    return None, cfg


def _element(override, value: str) -> str:
    return f"{override.get_key_element()}={value}"


def bertkit_problem(args: tuple[str, ...]) -> str | None:
    multirun = any(arg in ("-m", "--multirun") for arg in args)
    flags = [arg for arg in args if arg.startswith("-")
             and arg not in ("-m", "--multirun", "--help", "--hydra-help")]
    if flags:
        return f"not a bertkit/Hydra flag the docs should need: {flags}"
    overrides = [arg for arg in args if not arg.startswith("-")]
    try:
        parsed = PARSER.parse_overrides(overrides)
    except Exception as err:  # noqa: BLE001
        return f"override syntax: {_first_line(err)}"
    if not multirun:  # Hydra's run mode refuses a sweep (a=1,2) without -m
        return _composed(tuple(overrides))[0]
    # A multirun: every sweep at its first value; then each other alternative of a swept
    # config group, which changes what composes (a swept value only has to parse).
    base = [_element(o, next(o.sweep_string_iterator())) if o.is_discrete_sweep() else o.input_line
            for o in parsed if not o.is_sweep_override() or o.is_discrete_sweep()]
    problem, cfg = _composed(tuple(base))
    if problem:
        return problem
    given = {o.key_or_group for o in parsed}
    params = OmegaConf.select(cfg, "hydra.sweeper.params") or {}
    try:
        preset = PARSER.parse_overrides([f"{key}={value}" for key, value in params.items()
                                         if key not in given])
    except Exception as err:  # noqa: BLE001
        return f"the sweep preset's hydra.sweeper.params: {_first_line(err)}"
    groups = set(cfg.hydra.runtime.choices)
    for override in preset:
        if override.key_or_group not in groups and not override.key_or_group.startswith("hydra.") \
                and override.get_key_element()[0] not in "+~" \
                and OmegaConf.select(cfg, override.key_or_group, default=_ABSENT) is _ABSENT:
            return f"the sweep preset sweeps {override.key_or_group}, which the config lacks"
    for index, override in enumerate([*parsed, *preset]):
        if override.key_or_group not in groups or not override.is_discrete_sweep():
            continue
        on_line = index < len(parsed)
        for value in list(override.sweep_string_iterator())[1 if on_line else 0:]:
            variant = [_element(override, value) if b.split("=", 1)[0] == override.get_key_element()
                       else b for b in base] if on_line else [*base, _element(override, value)]
            problem = _composed(tuple(variant))[0]
            if problem:
                return f"{_element(override, value)}: {problem}"
    return None


def benchmark_problem(module: str, args: tuple[str, ...]) -> str | None:
    """`python -m benchmarks.<module> <overrides>`: a benchmark's command, whose config composes
    and passes the checks its job makes before it reads anything."""
    flags = [arg for arg in args if arg.startswith("-")]
    if flags:
        return f"not a Hydra flag the docs should need: {flags}"
    try:
        config = importlib.import_module(module).CONFIG
    except (ImportError, AttributeError) as err:
        return f"not a benchmark's command: {_first_line(err)}"
    return _benchmark_composed(config, args)


@functools.cache
def _benchmark_composed(config: str, overrides: tuple[str, ...]) -> str | None:
    """The benchmark's own composition, outside the module's Hydra of bertkit's config tree
    (set aside meanwhile, then put back)."""
    outer = GlobalHydra.instance().hydra
    GlobalHydra.instance().clear()
    try:
        cfg = compose_benchmark(config, list(overrides))
        check_task_family(OmegaConf.select(cfg, "recipe"), OmegaConf.select(cfg, "task"))
        check_ranges(cfg)
        check_settings(cfg)
    except Exception as err:  # noqa: BLE001 - any failure is the finding
        return f"{type(err).__name__}: {_first_line(err)}"
    finally:  # Hydra's initialisation restores its state as a new instance: fetched anew
        GlobalHydra.instance().clear()
        if outer is not None:
            GlobalHydra.instance().initialize(outer)
    return None


def check_of(checks: dict, program: str):
    """The check of a command's program (a benchmark's module: its composition)."""
    if program.startswith("benchmarks."):
        return functools.partial(benchmark_problem, program)
    return checks[program]


def report_problem(args: tuple[str, ...]) -> str | None:
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            parse_report_args(list(args))
    except SystemExit as exit_:
        if exit_.code:
            return stderr.getvalue().strip().splitlines()[-1]
    return None


def make_dry_run(args: tuple[str, ...]) -> tuple[str | None, list[Command]]:
    """(problem, the bertkit commands the target would run)."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("MAKE") and key != "MFLAGS"}
    result = subprocess.run(["make", "--dry-run", "--no-print-directory", *args], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=60)
    if result.returncode:
        return result.stderr.strip().splitlines()[-1], []
    shown = f"make {' '.join(args)}"
    recipe = result.stdout.replace("\\\n", " ").splitlines()
    return None, [command for number, line in enumerate(recipe, 1)
                  for command in commands_in(line, f"{shown} (recipe line {number})")
                  if command.program != "make"]


def _overrides_parse(args: tuple[str, ...]) -> str | None:
    try:
        PARSER.parse_overrides([arg for arg in args if not arg.startswith("-")])
    except Exception as err:  # noqa: BLE001
        return f"override syntax: {_first_line(err)}"
    return None


def make_problem(args: tuple[str, ...], compose_what_it_runs: bool = False) -> str | None:
    """The target exists and its bertkit commands parse; composed too when asked (the slow
    test: the Makefile's targets run many configurations of their own)."""
    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    problem, commands = make_dry_run(args)
    if problem:
        return problem
    checks = {**CHECKS, "bertkit": bertkit_problem if compose_what_it_runs else _overrides_parse}
    problems = [f"{command}: {problem}" for command in commands
                if (problem := command.error or check_of(checks, command.program)(command.args))]
    return "\n  ".join(problems) or None


CHECKS = {"bertkit": bertkit_problem, "bertkit-report": report_problem, "make": make_problem}
MAKE_COMMANDS = sorted({command.args: command for command in COMMANDS
                        if command.program == "make" and not command.error}.values(),
                       key=lambda command: command.source)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda command: command.source)
def test_documented_command_works(command):
    assert command.error is None, f"{command}\n  {command.error}"
    problem = check_of(CHECKS, command.program)(command.args)
    assert problem is None, f"{command}\n  {problem}"


@pytest.mark.slow
@pytest.mark.parametrize("command", MAKE_COMMANDS, ids=lambda command: command.source)
def test_what_documented_make_commands_run_composes(command):
    problem = make_problem(command.args, compose_what_it_runs=True)
    assert problem is None, f"{command}\n  {problem}"


def test_every_page_with_commands_is_read():
    pages = {command.source.split(":", 1)[0] for command in COMMANDS}
    assert {"README.md", "docs/finetuning.md", "docs/scale.md",
            "docs/reports.md", "cards/glue.md", "cards/minilm.md"} <= pages
    programs = {command.program.split(".")[0] for command in COMMANDS}
    assert programs == {"bertkit", "bertkit-report", "make", "benchmarks"}


def test_the_reader_follows_the_shell_and_the_docs_conventions(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("\n".join([
        "Run `bertkit recipe=glue",
        "task=rte` or `python -m bertkit ...`; `bertkit` is the command.",
        "```",
        'P="trainer.max_steps=2 seed=1"',
        "bertkit -m recipe=glue task=<rte|mrpc> \\",
        "        $P finetuning=llrd,full   # a comment: bertkit recipe=nope",
        "OMP_NUM_THREADS=1 taskset -c 0 bertkit recipe=glue ... hydra.run.dir=<stamp>",
        "torchrun --nproc_per_node=2 -m bertkit recipe=glue; bertkit-report multirun/ [--paired]",
        "make glue-rte [NPROC=2] [O=\"...\"]",
        "python cards/finetuning/methods_table.py mrpc",
        "```",
        "```",
        "bertkit/",
        "  cli.py   the `bertkit` command's home (no shell here)",
        "```",
    ]) + "\n")
    found = [(c.source, c.program, c.args) for c in documented_commands([page])]
    assert all(c.error is None for c in documented_commands([page]))
    assert found == [
        ("page.md:1", "bertkit", ("recipe=glue", "task=rte")),
        ("page.md:2", "bertkit", ()),
        ("page.md:5[rte]", "bertkit", ("-m", "recipe=glue", "task=rte", "trainer.max_steps=2",
                                      "seed=1", "finetuning=llrd,full")),
        ("page.md:5[mrpc]", "bertkit", ("-m", "recipe=glue", "task=mrpc", "trainer.max_steps=2",
                                       "seed=1", "finetuning=llrd,full")),
        ("page.md:7", "bertkit", ("recipe=glue", "hydra.run.dir=2025-01-01_00-00-00")),
        ("page.md:8", "bertkit", ("recipe=glue",)),
        ("page.md:8", "bertkit-report", ("multirun/", "--paired")),
        ("page.md:9", "make", ("glue-rte", "NPROC=2")),
    ]


def test_what_the_docs_must_not_do_is_reported(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("\n".join([
        "```",
        "bertkit recipe=glue task=<a task>",
        "bertkit recipe=glue model.name_or_path=$M",
        "bertkit recipe=glue task=rte model=scratch_tiny",
        "  trainer.max_steps=10",
        "```",
    ]) + "\n")
    errors = [c.error for c in documented_commands([page])]
    assert "<a task> is not a known placeholder" in errors[0]
    assert "$M is not set" in errors[1]
    assert errors[2] is None
    assert "no backslash" in errors[3]


def test_the_checks_catch_broken_commands():
    assert "model/bert-base-uncased" in bertkit_problem(
        ("recipe=glue", "task=mrpc", "model=bert-base-uncased"))
    assert "Ambiguous value" in bertkit_problem(("recipe=glue", "task=rte", "seed=1,2"))
    assert bertkit_problem(("-m", "recipe=glue", "task=rte", "seed=1,2")) is None
    assert "finetuning/nope" in bertkit_problem(("-m", "recipe=glue", "finetuning=full,nope"))
    assert "trainer.learnin_rate" in bertkit_problem(("recipe=glue", "trainer.learnin_rate=1"))
    assert "override syntax" in bertkit_problem(("recipe=squad", "/", "recipe=swag"))
    assert "task=squad_v1 is a squad task" in bertkit_problem(("recipe=glue", "task=squad_v1"))
    assert "trainer.learning_rate=-1.0" in bertkit_problem(("trainer.learning_rate=-1.0",))
    assert "required" in report_problem(("--compare", "a/*", "b/*"))
    assert report_problem(("multirun/", "--compare", "a/*", "b/*", "--paired")) is None


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_make_targets_are_checked_with_what_they_run():
    assert "No rule to make target" in make_problem(("no-such-target",))
    problem, commands = make_dry_run(("glue-rte", "NPROC=2", "O=trainer.max_steps=10"))
    assert problem is None
    assert [(c.program, c.args) for c in commands] == [
        ("bertkit", ("recipe=glue", "task=rte", "trainer.max_steps=10"))]
    assert make_problem(("glue-rte", "O=model=nope")) is None  # parsed only
    assert "model/nope" in make_problem(("glue-rte", "O=model=nope"), compose_what_it_runs=True)
    assert "override syntax" in make_problem(("glue-rte", "O=/"))
