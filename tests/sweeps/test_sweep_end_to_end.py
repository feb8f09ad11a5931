"""sweep=paper_grid end to end: a 2 x 2 grid over 2 seeds of a tiny model on generated data,
one job forced to fail (a simulated CUDA out-of-memory), then bertkit-report on the sweep."""

from __future__ import annotations

import json
import statistics

import pytest
import torch

from bertkit import cli
from bertkit.reporting.cli import main as report_main
from tests.sweeps.test_successive_halving import run_bertkit_in_process, tiny_sweep_overrides

FAILING_JOB = "wnli/bs16-lr0.0003-ep2/seed2"


@pytest.mark.slow
def test_paper_grid_sweep_with_a_failed_job_and_its_report(glue_dir, vocab_dir, tmp_path,
                                                           monkeypatch, capsys):
    data = glue_dir("wnli", n_train=64)
    sweep_dir, cache = tmp_path / "sweep", tmp_path / "cache"
    real_run_job = cli.run_job

    def run_or_run_out_of_memory(cfg):
        job = (cfg.trainer.per_device_train_batch_size, cfg.trainer.learning_rate, cfg.seed)
        if job == (16, 3e-4, 2):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_run_job(cfg)

    monkeypatch.setattr(cli, "run_job", run_or_run_out_of_memory)
    with pytest.raises(SystemExit) as stopped:  # after every job ran, naming the failed one
        run_bertkit_in_process(monkeypatch, "-m", "sweep=paper_grid", f"cache_dir={cache}",
                               *tiny_sweep_overrides(data, vocab_dir, sweep_dir))
    assert stopped.value.code == 1
    named = capsys.readouterr().err.splitlines()[-1]
    assert named.startswith(f"  {FAILING_JOB} [") and "seed=2" in named, named
    assert named.endswith("]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                          "2.00 GiB"), named

    finished = sorted(p.parent.relative_to(sweep_dir).as_posix()
                      for p in sweep_dir.rglob("metrics.json"))
    assert finished == sorted(f"wnli/bs{b}-lr{lr}-ep2/seed{s}" for b in (8, 16)
                              for lr in ("0.001", "0.0003") for s in (1, 2)
                              if f"wnli/bs{b}-lr{lr}-ep2/seed{s}" != FAILING_JOB)
    failure = json.loads((sweep_dir / FAILING_JOB / "failed.json").read_text())
    assert failure["error"] == ("torch.OutOfMemoryError: CUDA out of memory. "
                                "Tried to allocate 2.00 GiB")
    assert "Traceback" in failure["traceback"]
    assert "seed=2" in failure["overrides"]

    # Tokenised once: one cache entry, written before the first job wrote its config.
    (entry,) = (cache / "glue").iterdir()
    first_config = min((sweep_dir / job / "config.yaml").stat().st_mtime for job in finished)
    assert (entry / "train.arrow").stat().st_mtime <= first_config

    assert report_main([str(sweep_dir)]) == 0
    report = (sweep_dir / "report" / "report.md").read_text()
    assert "7 finished run(s) and 1 failed job(s)" in report
    assert (f"- `{FAILING_JOB}`: torch.OutOfMemoryError: CUDA out of memory. "
            f"Tried to allocate 2.00 GiB") in report

    # The best grid point and its cell, recomputed from the metrics files.
    by_point: dict[str, list[float]] = {}
    for job in finished:
        value = json.loads((sweep_dir / job / "metrics.json").read_text())["main_value"]
        by_point.setdefault(job.rsplit("/", 1)[0], []).append(value)
    def grid_point(point: str) -> tuple[float, int, float]:  # "wnli/bs8-lr0.001-ep2"
        batch, lr, epochs = point.split("/")[1].split("-")
        return float(lr[2:]), int(batch[2:]), float(epochs[2:])

    # The report's documented choice: best mean, then more seeds, then the smaller grid point.
    best = min(by_point, key=lambda p: (-statistics.mean(by_point[p]), -len(by_point[p]),
                                        grid_point(p)))
    values = [100 * v for v in by_point[best]]
    summary = json.loads((sweep_dir / "report" / "report.json").read_text())
    (system,) = summary["systems"]
    chosen = system["tasks"]["wnli"]
    assert chosen["run_dirs"] == [f"{best}/seed{s}" for s in (1, 2)
                                  if f"{best}/seed{s}" != FAILING_JOB]
    assert chosen["grid_points_tried"] == 4 and chosen["runs_tried"] == 7
    mean = statistics.mean(values)
    cell = f"{mean:.1f}" if len(values) == 1 else f"{mean:.1f} ± {statistics.stdev(values):.1f}"
    assert cell in summary["table_markdown"]
