"""The run path docs/architecture.md lists for a finetune and a pretraining run is the one the
code takes (tests/run_path.py counts it from the calls): a job reads top-down in a few files,
and no file sends its reader back to a file they are still reading.

`python -m tests.test_run_path --write` rewrites the lists after a change of the run path."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from bertkit.jobs import run_job
from tests.conftest import compose_config
from tests.pretraining.test_pretrain_recipe import tiny_pretraining_overrides
from tests.run_path import trace

PAGE = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
# At most this many files on a job's run path (issue 52's goal for a finetune: 10).
MOST_FILES = {"finetune": 10, "pretrain": 10}


def overrides(job: str) -> list[str]:
    if job == "finetune":  # the embedded default, `make demo`
        return ["logger=none", "trainer.num_train_epochs=1"]
    return tiny_pretraining_overrides(**{"trainer.max_steps": 8})  # the demo corpus


def measured(job: str, run_dir: Path) -> dict:
    cfg = compose_config(overrides(job))
    return trace(lambda: run_job(cfg, run_dir)).run_path()


def listed(job: str, page: str | None = None) -> list[str]:
    page = PAGE.read_text(encoding="utf-8") if page is None else page
    block = re.search(rf"<!-- run path: {job} -->\n(.*?)<!-- end run path -->", page, re.S)
    return re.findall(r"^\d+\. `([^`]+)`", block.group(1), re.M)


@pytest.mark.slow  # a finetune and a pretraining run, profiled
@pytest.mark.parametrize("job", ["finetune", "pretrain"])
def test_the_page_lists_the_run_path_the_code_takes(job, tmp_path):
    path = measured(job, tmp_path / "run")
    assert listed(job) == path["in_order"]
    assert path["files"] <= MOST_FILES[job]
    assert path["called_back"] == 0


def write(run_dir: Path) -> None:
    """Rewrites both lists in docs/architecture.md from a measurement (the numbered list: each
    file once, in the order the job first enters it)."""
    page = PAGE.read_text(encoding="utf-8")
    for job in ("finetune", "pretrain"):
        files = measured(job, run_dir / job)["in_order"]
        lines = "".join(f"{n}. `{name}`\n" for n, name in enumerate(files, 1))
        page = re.sub(rf"(<!-- run path: {job} -->\n).*?(<!-- end run path -->)",
                      lambda match, lines=lines: match.group(1) + lines + match.group(2),
                      page, flags=re.S)
    PAGE.write_text(page, encoding="utf-8")


if __name__ == "__main__" and "--write" in sys.argv:
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        write(Path(directory))
