"""The paper's finetuning grids under their true names (Devlin et al. 2019), each checked
against the paper's own words: section 4.1's GLUE protocol, appendix A.3's grid, and the union
of the two that is usually quoted as "the paper's grid"."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from bertkit.config_tree import config_dir
from tests.conftest import compose_config

SWEEP_DIR = Path(config_dir()) / "sweep"
BATCH = "trainer.per_device_train_batch_size"
RATE = "trainer.learning_rate"
EPOCHS = "trainer.num_train_epochs"

# What the paper says, and where.
SECTION_4_1 = {BATCH: {32}, RATE: {5e-5, 4e-5, 3e-5, 2e-5}, EPOCHS: {3}}
APPENDIX_A_3 = {BATCH: {16, 32}, RATE: {5e-5, 3e-5, 2e-5}, EPOCHS: {2, 3, 4}}
UNION = {key: SECTION_4_1[key] | APPENDIX_A_3[key] for key in SECTION_4_1}
PAPER_GRIDS = {
    "paper_glue": (SECTION_4_1, "section 4.1", 4),
    "paper_appendix": (APPENDIX_A_3, "appendix A.3", 18),
    "paper_grid": (UNION, "union", 24),
}


def swept_values(sweep: str) -> dict[str, set]:
    """Each swept key's values, as Hydra's sweeper expands them from the composed config."""
    cfg = compose_config(["recipe=glue", "task=rte", f"sweep={sweep}"], with_hydra=True)
    parser = OverridesParser.create()
    values = {}
    for key, spec in cfg.hydra.sweeper.params.items():
        override = parser.parse_override(f"{key}={spec}")
        values[key] = set(override.sweep_iterator() if override.is_sweep_override()
                          else [override.value()])
    return values


def paper_sweeps() -> list[str]:
    """Every sweep preset named after the paper, halving variants aside (they reuse a grid)."""
    return sorted(path.stem for path in SWEEP_DIR.glob("paper_*.yaml")
                  if not path.stem.endswith("_halving"))


def test_every_paper_sweep_is_one_of_the_papers_grids():
    assert paper_sweeps() == sorted(PAPER_GRIDS)


@pytest.mark.parametrize("sweep", sorted(PAPER_GRIDS))
def test_a_paper_sweep_is_the_grid_its_source_states(sweep):
    expected, source, points = PAPER_GRIDS[sweep]
    values = swept_values(sweep)
    assert values == expected
    assert len(list(itertools.product(*values.values()))) == points
    assert source in (SWEEP_DIR / f"{sweep}.yaml").read_text()


def test_the_halving_variant_halves_the_union_grid():
    assert swept_values("paper_grid_halving") == UNION
    cfg = compose_config(["recipe=glue", "task=rte", "sweep=paper_grid_halving"],
                         with_hydra=True)
    assert cfg.hydra.sweeper._target_.endswith("HalvingSweeper")


@pytest.mark.parametrize("sweep", sorted(PAPER_GRIDS))
def test_each_paper_sweep_tags_its_own_name(sweep):
    cfg = compose_config(["recipe=glue", "task=rte", f"sweep={sweep}"])
    assert cfg.logger.sweep_tag == sweep
