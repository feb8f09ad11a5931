"""Secrets stay secret (docs/reliability.md#secrets): a token, API key or password given on the
command line, in a YAML file or through ${oc.env:...} reaches the run, and no file bertkit or
Hydra leaves, nor the printed log, holds it; the mask stands where the key was."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import OmegaConf

from bertkit.config_paths import recipes_dir
from bertkit.reporting.cli import main as report_main
from bertkit.secret_masking import MASK, SECRET_KEYS, is_secret_key, mask_secrets, mask_text
from tests.conftest import compose_config, tiny_run_overrides
from tests.pretraining.test_heldout import tiny_run as tiny_pretraining_run
from tests.wandb_records import read_offline_run


def key_named_by(pattern: str) -> str:
    """A key each pattern of SECRET_KEYS names: `*_token` -> `my_token`."""
    return pattern.replace("*", "my")


@pytest.mark.parametrize("pattern", SECRET_KEYS)
def test_every_secret_key_is_masked_in_records_overrides_and_texts(pattern):
    key, value = key_named_by(pattern), "s3cr3t-" + secrets.token_hex(8)
    assert is_secret_key(key) and is_secret_key(f"+trainer.{key.upper()}")
    record = {"trainer": {key: value, "learning_rate": 1e-3}, "url": f"https://x/{value}",
              "overrides": [f"+trainer.{key}={value}", "seed=1"]}
    assert mask_secrets(record) == {
        "trainer": {key: MASK, "learning_rate": 1e-3}, "url": f"https://x/{MASK}",
        "overrides": [f"+trainer.{key}={MASK}", "seed=1"]}
    for text in (f"bertkit '+trainer.{key}={value}' seed=1", json.dumps({key: value}),
                 f"{key}: {value}\n", repr({key: value})):
        assert value not in mask_text(text) and MASK in mask_text(text), text


def config_keys(node, prefix: str = ""):
    for key, value in node.items():
        yield f"{prefix}{key}"
        if isinstance(value, dict):
            yield from config_keys(value, f"{prefix}{key}.")


def test_no_setting_of_bertkit_is_named_like_a_secret():
    """Every recipe and preset composed, Hydra's node too: none of bertkit's own keys (nor the
    Hydra settings bertkit's config gives) would be masked."""
    named = [("recipe", p.stem) for p in (Path(recipes_dir()) / "recipe").glob("*.yaml")]
    named += [("experiment", p.stem) for p in (Path(recipes_dir()) / "experiment").glob("*.yaml")]
    for group, name in named:
        cfg = OmegaConf.to_container(compose_config([f"{group}={name}"], with_hydra=True),
                                     resolve=False)
        assert not [key for key in config_keys(cfg) if is_secret_key(key)], (group, name)


def bertkit(*overrides: str, env: dict, status: int = 0) -> subprocess.CompletedProcess:
    """The `bertkit` command, as a user runs it; its output kept."""
    done = subprocess.run([sys.executable, "-m", "bertkit", *overrides], env=env,
                          capture_output=True, timeout=600)
    assert done.returncode == status, done.stderr.decode()[-3000:]
    return done


@pytest.mark.slow
def test_no_secret_in_any_file_or_log_of_a_finetune_a_pretraining_and_a_sweep(
        glue_dir, vocab_dir, tmp_path, capsys):
    token, password, api_key, hf_token = ("tok-" + secrets.token_hex(12) for _ in range(4))
    every = {"command line": token, "YAML": password, "environment": api_key,
             "HF_TOKEN": hf_token}
    # A user's YAML preset (on the search path): a literal password, and an API key and a URL
    # holding it through interpolation of an environment variable other than HF_TOKEN.
    presets = tmp_path / "presets"
    (presets / "experiment").mkdir(parents=True)
    (presets / "experiment" / "with_secrets.yaml").write_text(
        "# @package _global_\nservice:\n"
        f"  password: {password}\n"
        "  api_key: ${oc.env:BERTKIT_TEST_SERVICE_KEY}\n"
        "  notify_url: https://hooks.example.com/${.api_key}\n")
    env = {**os.environ, "BERTKIT_TEST_SERVICE_KEY": api_key, "HF_TOKEN": hf_token,
           "WANDB_MODE": "offline", "WANDB_SILENT": "true", "HF_HUB_OFFLINE": "1"}
    secret_settings = [f"hydra.searchpath=[file://{presets}]", "experiment=with_secrets",
                       f"+trainer.hub_token={token}"]
    out = tmp_path / "out"
    finetune, pretraining, sweep = out / "finetune", out / "pretraining", out / "sweep"
    data = glue_dir("rte")

    printed = [bertkit(*tiny_run_overrides("rte", data, vocab_dir, **{
        "logger": "wandb", "trainer.save_strategy": "steps", "trainer.save_steps": 2}),
        *secret_settings, f"hydra.run.dir={finetune}", env=env)]
    printed.append(bertkit(*tiny_pretraining_run(), *secret_settings,
                           f"hydra.run.dir={pretraining}", env=env))
    # Two jobs, one refused (a negative learning rate): its failed.json, and the sweep's
    # summary of its failed jobs (exit status 1) with each one's overrides.
    printed.append(bertkit("-m", *tiny_run_overrides("rte", data, vocab_dir, **{
        "logger": "wandb", "trainer.learning_rate": "1e-3,-1"}), *secret_settings,
        f"hydra.sweep.dir={sweep}", env=env, status=1))
    assert b"  rte/trainer.learning_rate=-1 [trainer.learning_rate=-1]: " in printed[-1].stderr
    assert report_main([str(sweep), "--out", str(out / "report")]) == 0

    # Every file any of them left, and everything printed.
    files = [path for path in out.rglob("*") if path.is_file()]
    contents = {str(path): path.read_bytes() for path in files}
    for n, done in enumerate(printed):
        contents[f"stdout of run {n}"], contents[f"stderr of run {n}"] = done.stdout, done.stderr
    captured = capsys.readouterr()
    contents["report's output"] = (captured.out + captured.err).encode()
    for where, content in contents.items():
        for how, value in every.items():
            assert value.encode() not in content, f"the secret from the {how} is in {where}"

    # The writers ran, and the mask stands where each key was.
    names = {path.relative_to(out).as_posix() for path in files}
    for run in ("finetune", "pretraining", "sweep/rte/trainer.learning_rate=0.001"):
        assert {f"{run}/{name}" for name in ("config.yaml", "metrics.json", "model/README.md",
                                             "model/training_args.bin", ".hydra/config.yaml",
                                             ".hydra/hydra.yaml", ".hydra/overrides.yaml")} <= names
    assert {"sweep/multirun.yaml", "sweep/rte/trainer.learning_rate=-1/failed.json",
            "report/report.md"} <= names
    assert any(name.startswith("finetune/checkpoints/checkpoint-") for name in names)
    # The sweep's job directories are named by their swept setting (hydra.sweep.subdir).
    job = sweep / "rte" / "trainer.learning_rate=0.001"
    refused = sweep / "rte" / "trainer.learning_rate=-1"
    for run in (finetune, pretraining, job):
        config = yaml.safe_load((run / "config.yaml").read_text())
        assert config["trainer"]["hub_token"] == MASK
        assert config["service"] == {"password": MASK, "api_key": MASK,
                                     "notify_url": f"https://hooks.example.com/{MASK}"}
        assert f"+trainer.hub_token={MASK}" in yaml.safe_load(
            (run / ".hydra" / "overrides.yaml").read_text())
        hydra_config = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())
        assert hydra_config["service"]["password"] == MASK
        assert f"'+trainer.hub_token={MASK}'" in (run / "model" / "README.md").read_text()
        saved = torch.load(run / "model" / "training_args.bin", weights_only=False)
        assert saved.hub_token == MASK
    failed = json.loads((refused / "failed.json").read_text())
    assert f"+trainer.hub_token={MASK}" in failed["overrides"]
    for run in (finetune, job):
        (log,) = (run / "wandb").glob("offline-run-*/run-*.wandb")
        logged = read_offline_run(log.parent)["config"]["bertkit"]
        assert logged["trainer"]["hub_token"] == MASK and logged["service"]["password"] == MASK
