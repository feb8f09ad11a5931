"""`bertkit --help` and tab completion list real choices only, under bertkit's own header:
every config group of the tree (each folder of conf/ and recipes/{recipe,experiment}, read
from the tree itself) offers exactly its YAML files, no schema node, and nothing else (run
records, cards) is offered as a group."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bertkit.config_paths import config_dir, recipes_dir

ROOT = Path(__file__).resolve().parents[1]
# The groups recipes/ holds (hydra_plugins/bertkit_recipes puts recipes/ on the search path).
RECIPE_GROUPS = ("recipe", "experiment")


def tree_groups() -> dict[str, set[str]]:
    """group -> the names of its YAML files, for every folder of the config tree (a folder
    without YAML files, such as conf/deepspeed, offers nothing)."""
    folders = [(path, path.relative_to(config_dir()).as_posix())
               for path in Path(config_dir()).rglob("*") if path.is_dir()]
    folders += [(Path(recipes_dir()) / group, group) for group in RECIPE_GROUPS]
    return {group: {path.stem for path in folder.glob("*.yaml")} for folder, group in folders}


def is_hydras(group: str) -> bool:
    """Hydra's own groups (conf/hydra/...): Hydra and its plugins add choices of their own
    (hydra/launcher=basic, joblib, ...), listed by --hydra-help, not --help."""
    return group == "hydra" or group.startswith("hydra/")


class Completion:
    def __init__(self, plugin) -> None:
        self.plugin, self.config_loader = plugin, plugin.config_loader

    def __call__(self, line: str) -> list[str]:
        return self.plugin._query(config_name="config", line=line)


@pytest.fixture(scope="module")
def completion() -> Completion:
    """Hydra's shell completion as `bertkit -sc query=bash` runs it (the same query on the
    same search path), in this process: one line's answers."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.plugins.completion_plugin import DefaultCompletionPlugin

    from bertkit.cli import register_resolvers

    register_resolvers()
    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(config_dir()))
    return Completion(DefaultCompletionPlugin(loader))


def bertkit(*args: str, env_extra: dict | None = None) -> str:
    env = {**os.environ, "WANDB_MODE": "disabled", **(env_extra or {})}
    done = subprocess.run([sys.executable, "-m", "bertkit", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


@pytest.fixture(scope="module")
def help_text() -> str:
    return bertkit("--help")


def help_groups(text: str) -> dict[str, set[str]]:
    """The "== Configuration groups ==" section: group -> its choices."""
    section = text.split("== Configuration groups ==", 1)[1].split("== Config ==", 1)[0]
    groups = {}
    for line in section.splitlines()[1:]:
        if ": " in line:
            group, choices = line.split(": ", 1)
            groups[group] = set(choices.split(", "))
    return groups


@pytest.mark.slow
def test_help_opens_with_bertkits_own_header_and_the_readmes_usage(help_text):
    assert help_text.startswith("bertkit: BERT pretraining and finetuning"), help_text[:300]
    assert "powered by Hydra" not in help_text and "Powered by Hydra" not in help_text
    usage = help_text.split("Usage:", 1)[1].split("==", 1)[0]
    examples = [line.strip() for line in usage.splitlines() if line.strip()]
    assert len(examples) >= 5, usage
    readme = {line.strip() for line in (ROOT / "README.md").read_text().splitlines()}
    assert [line for line in examples if line not in readme] == []  # README's lines, as is
    footer = help_text.rsplit("== Config ==", 1)[1]
    assert "docs/configuration.md" in footer and "--hydra-help" in footer


@pytest.mark.slow
def test_help_lists_every_group_with_exactly_its_yaml_files(help_text):
    listed = help_groups(help_text)
    expected = {group: names for group, names in tree_groups().items()
                if names and not is_hydras(group)}
    assert {group: listed.get(group) for group in expected} == expected
    assert [(group, choice) for group, choices in listed.items() for choice in choices
            if "schema" in choice] == []


@pytest.mark.slow
def test_help_lists_no_group_outside_the_config_tree(help_text):
    """Run records and cards are no config groups (fails while they sit in recipes/cards on
    Hydra's search path: `cards/finetuning/runs/mrpc/full/seed_1: config`)."""
    assert sorted(set(help_groups(help_text)) - set(tree_groups())) == []


def test_completion_of_every_group_offers_exactly_its_yaml_files(completion):
    for group, names in sorted(tree_groups().items()):
        offered = completion(f"{group}=")
        assert all(o.startswith(f"{group}=") for o in offered), (group, offered)
        choices = {o.removeprefix(f"{group}=") for o in offered}
        if is_hydras(group):  # Hydra's own and its plugins' choices come on top
            assert names <= choices, (group, choices)
        else:
            assert choices == names, group
        assert not [c for c in choices if "schema" in c], (group, choices)


def test_no_group_hydra_knows_offers_a_schema_node(completion):
    """Every group Hydra finds on the search path and in its ConfigStore (where bertkit
    registers its schemas), as completion and --help read them."""
    from hydra.core.object_type import ObjectType

    loader = completion.config_loader

    def walk(parent: str):
        for name in loader.list_groups(parent):
            group = f"{parent}/{name}" if parent else name
            yield group, loader.get_group_options(group, ObjectType.CONFIG)
            yield from walk(group)

    groups = dict(walk(""))
    assert "trainer" in groups and "hydra/launcher" in groups  # the walk reached them
    assert [(group, choice) for group, choices in groups.items() for choice in choices
            if "schema" in choice] == []


def test_completion_offers_no_group_outside_the_config_tree(completion):
    """At the top level, every group offered is a folder of the tree (fails while run records
    and cards sit in recipes/cards on Hydra's search path: `cards/`)."""
    from bertkit.config_tree import compose_config

    keys = set(compose_config([]))
    top = {group.split("/", 1)[0] for group in tree_groups()}
    offered = {o.rstrip("=/") for o in completion("") if not o.endswith(".")}
    assert sorted(offered - keys - top) == []


@pytest.mark.slow
def test_the_completion_command_offers_the_groups_yaml_files():
    """`bertkit -sc query=bash` as the installed completion script calls it (COMP_LINE)."""
    answer = bertkit("-sc", "query=bash", env_extra={"COMP_LINE": "bertkit trainer="})
    assert answer.split() == sorted(f"trainer={name}" for name in tree_groups()["trainer"])


# What `bertkit` answers before any job runs, and the modules it must not import for it (about
# 6 s of torch, transformers and peft, where the answer takes about one).
HEAVY = ("torch", "transformers", "peft")
PROBE = """
import json, os, sys
from bertkit.cli import main
sys.argv = ["bertkit", *json.loads(os.environ["PROBE_ARGS"])]
try:
    main()
    code = 0
except SystemExit as stop:
    code = stop.code
with open(os.environ["PROBE_OUT"], "w") as out:
    json.dump({"code": code, "heavy": [m for m in HEAVY if m in sys.modules]}, out)
""".replace("HEAVY", repr(HEAVY))


@pytest.mark.parametrize("args, comp_line, code, said", [
    (["--help"], None, 0, "bertkit: BERT pretraining and finetuning"),
    (["-sc", "query=bash"], "bertkit trainer=", 0, "trainer=finetune"),
    (["trainer.learning_rate=fast"], None, 2,
     "bertkit: error: trainer.learning_rate='fast': expected a number"),
    (["task=rtee"], None, 1, "Could not find 'task/rtee'"),
])
def test_the_command_answers_without_importing_torch(args, comp_line, code, said, tmp_path):
    """`bertkit --help`, tab completion and a value refused as the config is composed import
    neither torch nor transformers: the jobs are imported where a job runs (bertkit.cli)."""
    env = {**os.environ, "WANDB_MODE": "disabled", "PROBE_ARGS": json.dumps(args),
           "PROBE_OUT": str(tmp_path / "probe.json")}
    env.pop("HYDRA_FULL_ERROR", None)
    if comp_line is not None:
        env["COMP_LINE"] = comp_line
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    seconds = time.perf_counter() - started
    probe = json.loads((tmp_path / "probe.json").read_text())
    assert probe == {"code": code, "heavy": []}, done.stderr[-2000:]
    assert said in done.stdout + done.stderr
    print(f"bertkit {' '.join(args)}: {seconds:.1f} s")  # shown by pytest -s; not a bound
