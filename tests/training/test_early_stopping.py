"""early_stopping.patience from the config: a run whose dev metric stops improving ends after
`patience` evaluations without improvement, and a setting it cannot work with is one message."""

from __future__ import annotations

import json

import pytest

from bertkit.errors import BertkitError
from bertkit.jobs import run_job
from tests.conftest import compose_config, tiny_run_overrides

WATCHED = {
    # Too small to flip any prediction (a rate of 0 is refused): nothing ever improves.
    "trainer.learning_rate": 1e-12,
    "trainer.warmup_steps": 0,
    "trainer.max_steps": 10,
    "trainer.eval_strategy": "steps",
    "trainer.eval_steps": 1,
    "trainer.save_strategy": "steps",
    "trainer.save_steps": 1,
    "trainer.metric_for_best_model": "validation_accuracy",
    "trainer.load_best_model_at_end": True,
}


@pytest.mark.slow  # a run per patience
@pytest.mark.parametrize(("patience", "steps"), [(None, 10), (1, 2), (3, 4)])
def test_training_stops_after_patience_evaluations_without_improvement(
        patience, steps, glue_dir, vocab_dir, tmp_path):
    overrides = tiny_run_overrides("rte", glue_dir("rte"), vocab_dir,
                                   **WATCHED, **{"early_stopping.patience": patience
                                                 if patience is not None else "null"})
    run_job(compose_config(overrides), run_dir=tmp_path / "run")
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    # The first evaluation sets the best value; each later one fails to improve on it.
    assert metrics["train"]["steps"] == steps


@pytest.mark.parametrize(("change", "message"), [
    ({"trainer.metric_for_best_model": "null"}, "needs trainer.metric_for_best_model"),
    ({"trainer.eval_strategy": "no", "trainer.save_strategy": "no",
      "trainer.load_best_model_at_end": False}, "needs trainer.metric_for_best_model"),
    ({"early_stopping.patience": 0}, "early_stopping.patience=0"),
])
def test_unusable_settings_are_refused_before_training(change, message, glue_dir, vocab_dir,
                                                       tmp_path):
    settings = {**WATCHED, "early_stopping.patience": 2, **change}
    cfg = compose_config(tiny_run_overrides("rte", glue_dir("rte"), vocab_dir, **settings))
    with pytest.raises(BertkitError, match=message):
        run_job(cfg, run_dir=tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.json").exists()
