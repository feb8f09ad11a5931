"""bertkit knows nothing of its benchmarks (benchmarks/, beside the package, issue 62): no
job, recipe, schema or import of theirs under bertkit/; a script of one's own (a benchmark)
runs its job through run_job's checks by passing it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra.errors import MissingConfigException
from omegaconf import OmegaConf

import bertkit
from bertkit.config_paths import recipes_dir
from bertkit.errors import BertkitError
from bertkit.jobs import JOBS, Job, run_job
from tests.conftest import compose_config

PACKAGE = Path(bertkit.__file__).resolve().parent
RESULT = "own_result.json"


def test_nothing_in_the_package_names_the_benchmarks():
    named = [f"{path.relative_to(PACKAGE.parent)}: {word}"
             for path in sorted(PACKAGE.rglob("*")) if path.is_file() and path.suffix != ".pyc"
             for word in ("benchmarks", "recipe=bench_")
             if word in path.read_text(encoding="utf-8", errors="replace")]
    assert named == []


def test_the_installed_package_leaves_the_benchmarks_out():
    pyproject = (PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8")
    assert 'packages = ["bertkit", "hydra_plugins"]' in pyproject.splitlines()


def test_the_jobs_are_bertkits_own():
    assert set(JOBS) == {"finetune", "pretrain"}
    assert all(job.entry is None or job.entry.startswith("bertkit.") for job in JOBS.values())
    assert not list((Path(recipes_dir()) / "recipe").glob("bench_*.yaml"))
    assert not list((Path(recipes_dir()) / "experiment").glob("bench_*.yaml"))


@pytest.mark.parametrize("selection", ["recipe=bench_parity", "experiment=bench_pretrain_quality"])
def test_a_benchmark_is_no_recipe_of_bertkit(selection):
    with pytest.raises(MissingConfigException, match=selection.split("=")[1]):
        compose_config([selection])


def test_an_unknown_job_names_bertkits_jobs():
    cfg = OmegaConf.create({"recipe": {"job": "nope"}, "task": {"family": "glue"}})
    with pytest.raises(BertkitError, match=r"^recipe\.job='nope': expected finetune, pretrain$"):
        run_job(cfg)


def own_job(cfg, run_dir) -> dict:
    """A script's own job: writes its result file."""
    result = {"seed": cfg.seed}
    (Path(run_dir) / RESULT).write_text(json.dumps(result))
    return result


def test_a_scripts_own_job_runs_through_run_jobs_checks(tmp_path):
    job = Job(f"{__name__}:own_job", RESULT)
    cfg = compose_config(["recipe=glue", "recipe.job=mine", "logger=none"])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert run_job(cfg, run_dir, job=job) == {"seed": cfg.seed}
    # Its result file makes the directory a finished run, refused as any job's.
    with pytest.raises(BertkitError, match=rf"^{run_dir} holds a finished run \({RESULT}\)"):
        run_job(cfg, run_dir, job=job)
    assert run_job(OmegaConf.merge(cfg, {"overwrite": True}), run_dir, job=job) == {
        "seed": cfg.seed}
