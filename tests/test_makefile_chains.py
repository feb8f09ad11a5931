"""Every make target that runs several commands (one per task, arm or file: glue, glue-grid,
the benchmarks, ...) runs all of them, then fails naming each command that failed; the
targets are found from the Makefile itself (each of its targets, dry-run), and run for real
with a fake bin directory whose commands fail where the test says."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAKEFILE = ROOT / "Makefile"
# A command of the venv that logs how it was called and fails when its call's number (over
# the whole target) is in FAIL.
FAKE_COMMAND = """#!/bin/sh
echo "$0 $*" >> "$CALLS"
n=$(wc -l < "$CALLS")
case " $FAIL " in *" $n "*) exit 3;; esac
exit 0
"""

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def fake_environment(tmp_path: Path) -> tuple[dict, Path]:
    """A venv whose bin holds a fake of every $(BIN)/command the Makefile names, installed
    already (its .installed newer than pyproject.toml), and a cache holding the MiniLM
    checkpoint (make minilm: done), so that a target runs its own commands only."""
    venv, cache = tmp_path / "venv", tmp_path / "cache"
    (venv / "bin").mkdir(parents=True)
    for name in set(re.findall(r"\$\(BIN\)/([\w.-]+)", MAKEFILE.read_text())):
        fake = venv / "bin" / name
        fake.write_text(FAKE_COMMAND)
        fake.chmod(0o755)
    (venv / ".installed").touch()
    minilm = cache / "models" / "all-MiniLM-L6-v2"
    minilm.mkdir(parents=True)
    (minilm / "config.json").write_text("{}")
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("MAKE") and key not in {"O", "NPROC", "MFLAGS"}}
    env["CALLS"] = str(tmp_path / "calls.log")
    return env, venv


def make(target: str, env: dict, venv: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", *flags, target, f"VENV={venv}",
                           f"BERTKIT_CACHE={venv.parent / 'cache'}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def targets(env: dict, venv: Path) -> list[str]:
    """Every target the Makefile declares (.PHONY, as make expands it: glue-cola, ...)."""
    database = make(".PHONY", env, venv, "-pq").stdout
    (line,) = [line for line in database.splitlines() if line.startswith(".PHONY:")]
    return sorted(line.removeprefix(".PHONY:").split())


def commands_of(target: str, env: dict, venv: Path) -> int:
    """How many of the venv's commands the target runs (make -n: printed, not run)."""
    dry = make(target, env, venv, "-n")
    assert dry.returncode == 0, dry.stderr
    return dry.stdout.count(f"{venv / 'bin'}/")


def test_every_target_that_runs_several_commands_runs_all_and_names_each_failure(tmp_path):
    env, venv = fake_environment(tmp_path)
    chains = {target: n for target in targets(env, venv)
              if (n := commands_of(target, env, venv)) > 1}
    assert "glue-grid" in chains, chains  # the Makefile was read (its sweeps, then a report)
    for target, count in chains.items():
        calls = Path(env["CALLS"])
        calls.unlink(missing_ok=True)
        # The first command fails (`&&` stopped there) and the last one (glue-grid's report).
        failing = [1, count]
        done = make(target, {**env, "FAIL": " ".join(map(str, failing))}, venv)
        ran = calls.read_text().splitlines()
        assert len(ran) == count, (target, ran, done.stderr)  # every command ran
        assert done.returncode != 0, (target, done.stdout, done.stderr)
        told = done.stderr[done.stderr.index(f"make {target}: these commands failed:"):]
        named = [line for line in told.splitlines()[1:] if line.startswith("  ")]
        assert named == [f"  {ran[n - 1]}  (exit 3)" for n in failing], (target, told)
        calls.unlink()
        done = make(target, {**env, "FAIL": ""}, venv)  # none fails: the target succeeds
        assert done.returncode == 0 and "failed" not in done.stderr, (target, done.stderr)
        assert len(calls.read_text().splitlines()) == count

