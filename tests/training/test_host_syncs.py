"""No host sync between logging steps: counted per optimizer step on the CPU
(benchmarks.host_syncs), for pretraining (static and dynamic masking, NSP and MLM alone)
and for a GLUE finetune. Trainer's own step made 3 (GLUE) and 7 (pretraining) per step."""

from __future__ import annotations

import pytest

import bertkit.training.run as lifecycle
from benchmarks.host_syncs import HostSyncCounter
from bertkit.jobs import run_job
from bertkit.pretraining.run import pretrain
from bertkit.tasks.glue.family import FAMILY
from bertkit.training.finetune import finetune
from tests.conftest import compose_config, tiny_run_overrides
from tests.pretraining.test_pretrain_recipe import tiny_pretraining_overrides
from tests.tasks.ner.test_ner_recipe import conll_files  # noqa: F401 (fixture)
from tests.tasks.squad.test_squad_recipe import squad_files  # noqa: F401 (fixture)

STEPS, LOGGING_STEPS = 12, 5
QUIET = {"trainer.max_steps": STEPS, "trainer.logging_steps": LOGGING_STEPS,
         "trainer.logging_first_step": False}


@pytest.fixture
def counted(monkeypatch):
    """Counts the syncs of the run's trainer.train(), the collator's host work left out."""
    seen = {}
    train = lifecycle._train_or_explain

    def counting(trainer, checkpoint):
        counter = HostSyncCounter()
        steps = counter.watch(trainer)
        with counter:
            output = train(trainer, checkpoint)
        seen.update(counter=counter, steps=steps)
        return output

    monkeypatch.setattr(lifecycle, "_train_or_explain", counting)
    return seen


def assert_no_syncs_between_logging_steps(seen) -> None:
    counter, logged = seen["counter"], seen["steps"].logged_steps
    assert logged == {5, 10, 12}  # the logging steps and the last one
    quiet = [step for step in range(1, STEPS + 1) if step not in logged]
    per_step = counter.per_step()
    assert sum(per_step[step] for step in quiet) == 0, counter.where(quiet)
    assert all(per_step[step] > 0 for step in logged)  # the counter sees the logging's reads


@pytest.mark.slow
@pytest.mark.parametrize("arm", [{}, {"masking": "dynamic"},
                                 {"masking": "dynamic", "objective": "mlm"}],
                         ids=["static-nsp", "dynamic-nsp", "dynamic-mlm"])
def test_pretraining_step_makes_no_host_sync(arm, counted, tmp_path):
    cfg = compose_config(tiny_pretraining_overrides(**QUIET, **arm, **{
        "cache_dir": str(tmp_path / "cache"), "heldout.fraction": 0}))
    record = pretrain(cfg, tmp_path / "run")
    assert_no_syncs_between_logging_steps(counted)
    # The tokens counted on the device still reach the record.
    assert record["train"]["tokens_seen"] > STEPS * 32 * 40


@pytest.mark.slow  # a run per arm
# A time budget (long enough not to stop) with its progress bar reads the host's clock only.
@pytest.mark.parametrize("arm", [{}, {"budget.minutes": 60, "trainer.disable_tqdm": False}],
                         ids=["plain", "budget-bar"])
def test_glue_step_makes_no_host_sync(arm, counted, glue_dir, vocab_dir, tmp_path):
    cfg = compose_config(tiny_run_overrides("mrpc", glue_dir("mrpc", n_train=120), vocab_dir,
                                            **QUIET, **arm, cache_dir=str(tmp_path / "cache")))
    finetune(cfg, FAMILY, tmp_path / "run")
    assert_no_syncs_between_logging_steps(counted)


FAMILY_QUIET = {**QUIET, "trainer.eval_strategy": "no", "trainer.save_strategy": "no",
                "trainer.load_best_model_at_end": False}


@pytest.mark.slow
def test_squad_swag_and_ner_steps_make_no_host_sync(counted, squad_files,  # noqa: F811
                                                    conll_files, tmp_path):  # noqa: F811
    from tests.ner_fixtures import write_vocab as ner_vocab
    from tests.swag_fixtures import make_rows, write_swag_csv
    from tests.tasks.ner.test_ner_recipe import ner_overrides
    from tests.tasks.squad.test_squad_features import write_vocab as squad_vocab
    from tests.tasks.squad.test_squad_recipe import squad_overrides
    from tests.tasks.swag.test_swag_recipe import swag_overrides

    train, dev = squad_files("v1.1", n_train=100)
    squad = squad_overrides("squad_v1", train, dev, squad_vocab(tmp_path / "squad_vocab"),
                            tmp_path / "squad", **FAMILY_QUIET)
    swag = swag_overrides(write_swag_csv(tmp_path / "swag" / "train.csv", make_rows(100, 1)),
                          write_swag_csv(tmp_path / "swag" / "val.csv", make_rows(8, 2)),
                          tmp_path / "swag", **FAMILY_QUIET)
    ner = ner_overrides(conll_files(n_train=100), ner_vocab(tmp_path / "ner_vocab"),
                        tmp_path / "ner", **FAMILY_QUIET)
    for name, overrides in (("squad", squad), ("swag", swag), ("ner", ner)):
        run_job(compose_config(overrides), run_dir=tmp_path / name / "run")
        assert_no_syncs_between_logging_steps(counted)
