"""A plain multirun's job directories are named by the job's swept settings (conf/config.yaml's
hydra.sweep.subdir), and bertkit-report --compare selects its runs by the settings that make
the report's rows, as the report names them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertkit.reporting.cli import main as report_main
from bertkit.training.wandb_logging import NAME_MAX, job_dirname
from tests.conftest import tiny_run_overrides
from tests.sweeps.test_successive_halving import run_bertkit_in_process


def launch(monkeypatch, sweep_dir: Path, data: Path, vocab: Path, *swept: str) -> list[str]:
    """A tiny multirun; its jobs' directories (of metrics.json), relative to the sweep."""
    run_bertkit_in_process(monkeypatch, "-m", *tiny_run_overrides(
        "wnli", data, vocab, **{"trainer.max_steps": 2}), *swept,
        f"hydra.sweep.dir={sweep_dir}", f"cache_dir={sweep_dir.parent / 'cache'}")
    return sorted(p.parent.relative_to(sweep_dir).as_posix()
                  for p in sweep_dir.rglob("metrics.json"))


@pytest.mark.slow  # a multirun of four tiny jobs, then the report
def test_multirun_jobs_are_named_by_their_swept_settings_and_compared_by_them(
        glue_dir, vocab_dir, tmp_path, monkeypatch, capsys):
    data = glue_dir("wnli", n_train=16)
    sweep = tmp_path / "sweep"
    jobs = launch(monkeypatch, sweep, data, vocab_dir, "finetuning=full,llrd", "seed=1,2")
    # The swept settings only, as Hydra's override_dirname writes them: not the command line's
    # paths (task.data_dir, model.tokenizer) nor its other settings.
    assert jobs == [f"wnli/finetuning={method},seed={seed}"
                    for method in ("full", "llrd") for seed in (1, 2)]
    for job in jobs:  # each directory holds the job its name says
        seed = json.loads((sweep / job / "metrics.json").read_text())["seed"]
        assert job.endswith(f"seed={seed}")

    assert report_main([str(sweep), "--reference", "none"]) == 0
    report = json.loads((sweep / "report" / "report.json").read_text())
    row_keys = report["rows_split_by"]["keys"]
    systems = {s["system"]: s for s in report["systems"]}
    assert len(systems) == 2 and "finetuning.name" in row_keys

    # Each row selected by its settings, full keys (report.json's), and by the name the table
    # gives it (short keys: finetuning=llrd): the runs of that row, its label the selection.
    first, second = sorted(systems.values(), key=lambda s: s["system"])
    by_settings = [" ".join(f"{k}={v}" for k, v in s["settings"].items()) for s in
                   (first, second)]
    by_name = [" ".join(s["system"].split(" · ")[1:]) for s in (first, second)]
    assert all(by_name)
    for a, b in (by_settings, by_name):
        capsys.readouterr()
        assert report_main([str(sweep), "--reference", "none", "--compare", a, b]) == 0
        (comparison,) = json.loads(
            (sweep / "report" / "report.json").read_text())["comparisons"]
        result = comparison["tasks"]["wnli"]
        assert (result["a"]["system"], result["b"]["system"]) == (first["system"],
                                                                  second["system"])
        assert result["a"]["run_dirs"] == first["tasks"]["wnli"]["run_dirs"]
        assert result["b"]["run_dirs"] == second["tasks"]["wnli"]["run_dirs"]
        assert (comparison["label_a"], comparison["label_b"]) == (a, b)
        md = (sweep / "report" / "report.md").read_text(encoding="utf-8")
        assert f"| `{b}` vs `{a}` | WNLI" in md

    # A value no run has: one line naming the key's values that exist.
    values = sorted({s["settings"]["finetuning.name"] for s in systems.values()})
    assert report_main([str(sweep), "--compare", "finetuning=lora", by_name[0]]) == 2
    error = capsys.readouterr().err.strip()
    assert error == (f"bertkit-report: error: --compare: no run has finetuning.name=lora; its "
                     f"values: {', '.join(values)}")
    # A key no run has: the keys the runs differ by, the report's row keys among them.
    assert report_main([str(sweep), "--compare", "masking=static", by_name[0]]) == 2
    error = capsys.readouterr().err.strip()
    assert "no setting 'masking'" in error and "\n" not in error
    assert all(key in error for key in row_keys + ["seed"])
    # A glob that matches nothing: the run directories that exist.
    assert report_main([str(sweep), "--compare", "wnli/[0-9]", by_name[0]]) == 2
    error = capsys.readouterr().err.strip()
    assert "matches no run directory" in error and jobs[0] in error


def test_a_job_directory_is_a_safe_name_of_its_swept_settings():
    swept = {"task.data_dir", "seed", "hydra.launcher.n_jobs", "model.tokenizer"}
    overrides = ["task.data_dir=/data/glue/RTE", "seed=2", "hydra.launcher.n_jobs=2",
                 "model.tokenizer=../vocab/", "trainer.max_steps=3"]
    name = job_dirname(overrides, swept, 7)
    # Sorted as override_dirname; hydra.* and unswept keys out; a path by its last part and
    # a digest: no '/' (no nested directories), and two paths ending alike stay apart.
    items = name.split(",")
    assert [i.split("=")[0] for i in items] == ["model.tokenizer", "seed", "task.data_dir"]
    assert "/" not in name and items[1] == "seed=2"
    assert items[0].startswith("model.tokenizer=vocab-")
    assert items[2].startswith("task.data_dir=RTE-")
    other = job_dirname(["task.data_dir=/other/RTE", "seed=2"], swept, 8)
    assert other.split(",")[1] != items[2]
    # Nothing swept (a multirun of one job), or a sweeper that records no keys: the job number.
    assert job_dirname(["trainer.max_steps=3"], swept, 7) == "7"
    assert job_dirname(overrides, None, 7) == "7"
    # A name no longer than a file name may be, still unique.
    long_a = job_dirname([f"task.name={'a' * 400}"], {"task.name"}, 0)
    long_b = job_dirname([f"task.name={'a' * 399}b"], {"task.name"}, 0)
    assert len(long_a) <= NAME_MAX and len(long_b) <= NAME_MAX and long_a != long_b
