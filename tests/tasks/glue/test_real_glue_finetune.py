"""Real GLUE files (skipped unless BERTKIT_DATA is set): a tiny model finetuned for a few
steps on MRPC and RTE with the bert-base-uncased WordPiece vocabulary."""

from __future__ import annotations

import json

import pytest

from bertkit.jobs import run_job
from tests.conftest import compose_config, real_data_dir, tiny_run_overrides

EXPECTED = {"mrpc": ("MRPC", 408, {"f1", "accuracy"}), "rte": ("RTE", 277, {"accuracy"})}


@pytest.mark.real_data
@pytest.mark.parametrize("task", sorted(EXPECTED))
def test_tiny_finetune_on_real_files(task, tmp_path):
    root = real_data_dir()
    directory, n_dev, metric_keys = EXPECTED[task]
    overrides = tiny_run_overrides(task, root / "glue" / directory,
                                   root / "vocab" / "bert-base-uncased",
                                   **{"trainer.max_steps": 6})
    run_dir = tmp_path / "run"
    run_job(compose_config(overrides), run_dir=run_dir)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    values = metrics["validation"]["validation"]
    assert set(values) == metric_keys
    assert all(0.0 <= v <= 1.0 for v in values.values())
    rows = (run_dir / "predictions" / "validation.tsv").read_text().splitlines()
    assert len(rows) == 1 + n_dev
    # Real files have no test.tsv here, so no leaderboard file is written.
    assert not (run_dir / "leaderboard").exists()
