"""The package's import rules (docs/architecture.md), read from the code: every `import`
of bertkit, lazy ones inside functions included, against what its subpackage may import. A rule
broken names the file, the line and the import."""

from __future__ import annotations

import ast
from pathlib import Path

import bertkit

# Subpackage -> the subpackages it may import ("tasks.*" is every family, "tasks" the
# table of families alone).
# A subpackage imports itself freely; a family never another family.
LEAVES = {"errors", "config_paths", "config_tree", "config_schema",
          "wandb_credentials", "secret_masking"}
RULES: dict[str, set[str]] = {
    "errors": set(),
    "config_paths": set(),  # read by hydra_plugins/bertkit_recipes: imports nothing heavy
    "config_tree": {"errors", "config_schema", "config_paths"},
    "config_schema": {"errors"},
    "wandb_credentials": set(),
    "secret_masking": set(),  # every writer masks secrets with it
    "data": {"errors"},
    # Written once for every family, below the template and the families. training.trainer:
    # the trainer internals (its edits of a built Trainer), not the rest of training.
    # data.atomic_files: the LoRA adapters it saves follow the umask like every other result file.
    "finetuning": {"errors", "training.trainer", "data.atomic_files"},
    "sweeps": {"data", "errors"},
    "training": {"data", "finetuning", *LEAVES},
    "tasks": {"errors"},
    "tasks.*": {"data", "training", *LEAVES},
    "pretraining": {"data", "training", "tasks", *LEAVES},
    "reporting": {"data", *LEAVES},
    "jobs": {"data", "training", "finetuning", "tasks", "pretraining", *LEAVES},
    "cli": {"jobs", "data", "training", "reporting", *LEAVES},
    "__main__": {"cli"},
    "bertkit": set(),
}


def subpackage_of(module: str) -> str:
    """bertkit.tasks.glue.family -> tasks.glue; bertkit.training.run -> training."""
    parts = module.split(".")[1:]
    if not parts:
        return "bertkit"
    if parts[0] == "tasks" and len(parts) > 1:
        return f"tasks.{parts[1]}"
    return parts[0]


def allowed(source: str, target_module: str, rules: dict[str, set[str]]) -> bool:
    target = subpackage_of(target_module)
    if target == source:
        return True
    permitted = rules["tasks.*" if source.startswith("tasks.") else source]
    if target.startswith("tasks.") and "tasks.*" in permitted:
        return True
    # A subpackage named with its module (finetuning.settings) permits that module and below only.
    module_rules = {rule for rule in permitted if "." in rule and not rule.startswith("tasks")}
    if any(target_module == f"bertkit.{rule}" or target_module.startswith(f"bertkit.{rule}.")
           for rule in module_rules):
        return True
    return target in permitted


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def violations(package_dir: Path, rules: dict[str, set[str]]) -> list[str]:
    broken = []
    for path in sorted(package_dir.rglob("*.py")):
        source = subpackage_of(module_name(path, package_dir))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module]
            else:
                continue
            for target in targets:
                if target.split(".")[0] == package_dir.name and not allowed(source, target,
                                                                            rules):
                    broken.append(f"{path.relative_to(package_dir.parent)}:{node.lineno}: "
                                  f"{source} imports {target}")
    return broken


def test_every_import_of_the_package_keeps_the_rules():
    package = Path(bertkit.__file__).parent
    subpackages = {subpackage_of(module_name(path, package)) for path in package.rglob("*.py")}
    unknown = {name for name in subpackages if name not in RULES and not name.startswith("tasks.")}
    assert not unknown, f"subpackages without a rule: {sorted(unknown)}"
    assert violations(package, RULES) == []


def test_a_broken_rule_is_found_with_its_file_and_line(tmp_path):
    """The checker itself: a lazy import of one family by another, and finetuning reaching into
    data beyond its atomic files, are both found; what the rules allow is not."""
    package = tmp_path / "bertkit"
    files = {
        "tasks/glue/family.py": "from bertkit.training.run import x\n",
        "tasks/ner/family.py": "import os\n\ndef f():\n    from bertkit.tasks.glue import y\n",
        "finetuning/lora_adapters.py": "from bertkit.data.atomic_files import follow_umask\n"
                                       "from bertkit.data.cache import cached\n",
        "training/run.py": "from bertkit.data import cache\n",
    }
    for name, text in files.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)

    assert violations(package, RULES) == [
        "bertkit/finetuning/lora_adapters.py:2: finetuning imports bertkit.data.cache",
        "bertkit/tasks/ner/family.py:4: tasks.ner imports bertkit.tasks.glue",
    ]
