"""Messages name what the user set (issue 40, part 4): a limit that comes from another setting
(the model's position embeddings) is reported in the key the user typed, and a model preset
whose local files are missing says how to get them, before any data is read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from bertkit.config_tree import config_dir
from bertkit.errors import BertkitError
from bertkit.jobs import run_job
from tests.conftest import compose_config

MODEL_PRESETS = sorted(path.stem for path in (Path(config_dir()) / "model").glob("*.yaml"))


@pytest.mark.parametrize("overrides, key, length, positions", [
    # The issue's case: was "sequences of 1024 tokens do not fit
    # model.config.max_position_embeddings=512", naming neither key nor fix.
    (["recipe=pretrain", "pretraining.max_seq_length=1024"], "pretraining.max_seq_length",
     1024, 512),
    (["recipe=pretrain", "model.config.max_position_embeddings=256"],
     "pretraining.long_phase.max_seq_length", 512, 256),
])
def test_a_length_beyond_the_model_positions_names_the_key_the_user_set(
        overrides, key, length, positions, tmp_path):
    cfg = compose_config([*overrides, "logger=none", f"cache_dir={tmp_path / 'cache'}"])
    with pytest.raises(BertkitError) as error:
        run_job(cfg, run_dir=tmp_path / "run")
    message = str(error.value)
    assert re.match(rf"^{re.escape(key)}={length} exceeds the {positions} positions of "
                    rf"model\.config\.max_position_embeddings: ", message), message
    assert f"lower {key} to at most {positions}" in message and "\n" not in message
    assert not (tmp_path / "cache").exists()


def test_pretraining_phases_in_the_wrong_order_name_the_key_the_user_set(tmp_path):
    """Was "pretraining.long_phase.max_seq_length must exceed pretraining.max_seq_length"."""
    cfg = compose_config(["recipe=pretrain", "pretraining.max_seq_length=512"])
    with pytest.raises(BertkitError, match=r"^pretraining\.max_seq_length=512 is not below "
                                           r"pretraining\.long_phase\.max_seq_length=512 "):
        run_job(cfg, run_dir=tmp_path / "run")


def test_a_value_taken_from_another_key_names_that_key(tmp_path):
    """A trainer.per_device_train_batch_size: ${...} interpolated from another key: when the
    value is refused where it lands, the message says which key it came from (here one the
    schema does not know itself, so the landing key's check is the one that fires)."""
    cfg = compose_config(["recipe=glue", "+my.batch=0",
                          "trainer.per_device_train_batch_size=${my.batch}"])
    with pytest.raises(BertkitError, match=r"^trainer\.per_device_train_batch_size=0 \(set by "
                                           r"\$\{my\.batch\}\): expected a number >= 1$"):
        run_job(cfg, run_dir=tmp_path / "run")


def _fetched_presets() -> list[str]:
    """The model presets whose files are local, under the cache (read from conf/model/: a
    preset added there is tested too)."""
    marker = "/nonexistent-bertkit-cache"
    found = []
    for name in MODEL_PRESETS:
        model = compose_config(["recipe=glue", f"model={name}", f"cache_dir={marker}"]).model
        paths = [OmegaConf.select(model, key) for key in ("name_or_path", "tokenizer")
                 if not OmegaConf.is_missing(model, key)]
        if any(str(path).startswith(marker) for path in paths if path):
            found.append(name)
    return found


@pytest.mark.slow
def test_every_preset_with_local_files_says_where_they_come_from():
    assert "minilm_l6" in _fetched_presets()
    for name in _fetched_presets():
        model = compose_config(["recipe=glue", f"model={name}"]).model
        assert model.fetch.command, name
        assert model.fetch.directory in (model.name_or_path, model.tokenizer), name


@pytest.mark.parametrize("preset", _fetched_presets())
def test_a_preset_whose_local_files_are_missing_says_how_to_get_them(preset, tmp_path):
    cfg = compose_config(["recipe=glue", "task=rte", f"model={preset}", "logger=none",
                          f"cache_dir={tmp_path / 'cache'}"])
    with pytest.raises(BertkitError) as error:
        run_job(cfg, run_dir=tmp_path / "run")
    key = "name_or_path" if cfg.model.name_or_path == cfg.model.fetch.directory else "tokenizer"
    assert str(error.value) == (f"model.{key}={cfg.model.fetch.directory}: no such directory; "
                                f"`{cfg.model.fetch.command}` puts the files there")
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()
