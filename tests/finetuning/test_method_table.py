"""The table of finetuning methods (bertkit.finetuning.methods.METHODS): every module of the
package has its line, each line names its module's class, and a plain finetune imports none."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from pkgutil import resolve_name as imported

import bertkit.finetuning.methods as methods
from bertkit.finetuning.methods import METHODS, Method, active_methods
from tests.finetuning.method_fixtures import settings

MODULES = sorted(path.stem for path in Path(methods.__file__).parent.glob("*.py")
                 if path.stem != "__init__")


def test_every_method_module_has_its_line_naming_its_class():
    assert sorted(METHODS) == MODULES
    for name, entry in METHODS.items():
        method = imported(entry.method)
        assert issubclass(method, Method)
        assert method.__module__ == f"bertkit.finetuning.methods.{name}"


def test_each_preset_turns_on_its_method_and_full_none():
    assert active_methods(settings("finetuning=full")) == []
    assert [cls.__name__ for cls in active_methods(settings("finetuning=bitfit"))] == ["BitFit"]
    assert [cls.__name__ for cls in active_methods(settings("finetuning=lora"))] == ["Lora"]


def test_a_plain_finetune_imports_no_method_module():
    code = ("import sys\n"
            "from bertkit.finetuning.methods import ActiveMethods\n"
            "from tests.finetuning.method_fixtures import settings\n"
            "ActiveMethods(settings('finetuning=full'))\n"
            "print(sorted(m for m in sys.modules if m.startswith('bertkit.finetuning.methods.')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=Path(__file__).parents[2])
    assert done.stdout.strip() == "[]"
