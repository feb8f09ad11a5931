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
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from bertkit.config_paths import recipes_dir
from bertkit.reporting.cli import main as report_main
from bertkit.secret_masking import (
    MASK,
    SECRET_KEYS,
    SHORTEST_SECRET_TO_FIND_IN_TEXT,
    is_secret_key,
    mask_secrets,
    mask_text,
)
from bertkit.training.wandb_logging import job_dirname
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


# Every form in which Hydra's override grammar gives a setting one value or a sweep's values,
# {key} the setting and {a}, {b} its values (what a command line, multirun.yaml and
# override_dirname hold), and what the masked text must read.
OVERRIDE_FORMS = {
    "+trainer.{key}={a}": "+trainer.{key}=***",
    "+trainer.{key}={a},{b}": "+trainer.{key}=***,***",
    "+trainer.{key}=choice({a},{b})": "+trainer.{key}=choice(***,***)",
    "+trainer.{key}='{a}','{b}'": "+trainer.{key}='***','***'",
    '+trainer.{key}=choice("{a}","{b}")': '+trainer.{key}=choice("***","***")',
    "+trainer.{key}=shuffle(choice({a},{b}))": "+trainer.{key}=shuffle(choice(***,***))",
    "+trainer.{key}=[{a},{b}]": "+trainer.{key}=[***,***]",
    # override_dirname: the overrides of a job or a launch joined by commas.
    "seed=1,+trainer.{key}={a},{b},debug=smoke": "seed=1,+trainer.{key}=***,***,debug=smoke",
    # Hydra's error for an override whose quote is not closed.
    "LexerNoViableAltException: +trainer.{key}='{a}": "LexerNoViableAltException: "
                                                     "+trainer.{key}='***",
    "Error executing job with overrides: ['seed=1', '+trainer.{key}={a}']":
        "Error executing job with overrides: ['seed=1', '+trainer.{key}=***']",
}


@pytest.mark.parametrize("pattern", SECRET_KEYS)
def test_every_value_of_a_swept_secret_is_masked_in_every_form_of_an_override(pattern):
    """By its key alone (values too short to be looked for in texts): every value of a
    sweep, and a masked sweep still parses as a sweep of as many values (multirun.yaml is
    read back by the jobs that name their directories from it)."""
    key = key_named_by(pattern)
    a, b = (f"q{secrets.token_hex(1)}" for _ in range(2))
    assert len(a) < SHORTEST_SECRET_TO_FIND_IN_TEXT
    parser = OverridesParser.create()
    for form, expected in OVERRIDE_FORMS.items():
        text = form.format(key=key, a=a, b=b)
        assert mask_text(text) == expected.format(key=key), text
        if form.startswith("+"):
            (given,), (masked,) = (parser.parse_overrides([t]) for t in (text, mask_text(text)))
            assert masked.is_sweep_override() == given.is_sweep_override(), text
            if given.is_sweep_override():
                assert len(list(masked.sweep_string_iterator())) == 2, text


@pytest.mark.parametrize("pattern", SECRET_KEYS)
def test_a_swept_secret_names_its_job_directory_by_a_stand_in_that_prints_as_it_is(pattern):
    key = f"service.{key_named_by(pattern)}"
    swept = {key, "seed"}
    tokens = ["tok-" + secrets.token_hex(12) for _ in range(2)]
    names = [job_dirname([f"+{key}={token}", "seed=1"], swept, 0) for token in tokens]
    assert len(set(names)) == 2  # two values, two directories
    for name, token in zip(names, tokens, strict=True):
        assert token not in name and name.startswith(f"seed=1,{key}=masked-"), name
        assert mask_text(f"kept in sweep/rte/{name}") == f"kept in sweep/rte/{name}"
    assert job_dirname([f"+{key}={tokens[0]}", "seed=2"], swept, 0) == names[0].replace(
        "seed=1", "seed=2")  # the same value, the same stand-in (a resumed job's directory)


def config_keys(node, prefix: str = ""):
    for key, value in node.items():
        yield f"{prefix}{key}"
        if isinstance(value, dict):
            yield from config_keys(value, f"{prefix}{key}.")


@pytest.mark.slow  # composes every recipe and preset, Hydra's node too
def test_no_setting_of_bertkit_is_named_like_a_secret():
    """Every recipe and preset composed, Hydra's node too: none of bertkit's own keys (nor the
    Hydra settings bertkit's config gives) would be masked."""
    named = [("recipe", p.stem) for p in (Path(recipes_dir()) / "recipe").glob("*.yaml")]
    named += [("experiment", p.stem) for p in (Path(recipes_dir()) / "experiment").glob("*.yaml")]
    for group, name in named:
        cfg = OmegaConf.to_container(compose_config([f"{group}={name}"], with_hydra=True),
                                     resolve=False)
        assert not [key for key in config_keys(cfg) if is_secret_key(key)], (group, name)


def bertkit(*overrides: str, env: dict, status: int = 0,
            cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The `bertkit` command, as a user runs it; its output kept."""
    done = subprocess.run([sys.executable, "-m", "bertkit", *overrides], env=env, cwd=cwd,
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
        "logger": "wandb", "trainer.save_strategy": "steps", "trainer.save_steps": 2,
        "keep_checkpoints": True}),
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


@pytest.mark.slow
def test_no_swept_or_broken_secret_in_any_name_file_or_printed_line(tmp_path):
    """Through the command, from a directory of its own (its outputs where a user gets them):
    a sweep of two tokens and an API key, an override whose syntax is broken, a single run
    that crashes at its start with an error that is not bertkit's. No value is in a path's
    name, a file's bytes, or what was printed."""
    token_a, token_b, api_key = ("tok-" + secrets.token_hex(16) for _ in range(3))
    every = {"first swept token": token_a, "second swept token": token_b, "API key": api_key}
    env = {**os.environ, "BERTKIT_CACHE": str(tmp_path / "cache"), "WANDB_MODE": "offline",
           "WANDB_SILENT": "true", "HF_HUB_OFFLINE": "1"}
    demo = ["recipe=demo", "debug=smoke", "trainer.disable_tqdm=true"]
    printed = {
        # Two jobs: two tokens, one API key given as a sweep of one value (a choice).
        "sweep": bertkit("-m", *demo, "logger=wandb", f"+trainer.hub_token={token_a},{token_b}",
                         f"+service.api_key=choice('{api_key}')", env=env, cwd=tmp_path),
        # A quote left open: Hydra's syntax error quotes the override.
        "syntax error": bertkit(*demo, f"+trainer.hub_token='{token_a}", env=env, cwd=tmp_path,
                                status=1),
        # A keyword transformers' scheduler does not take: a TypeError as training starts,
        # which Hydra reports with the run's overrides and a traceback.
        "crash": bertkit(*demo, f"+trainer.hub_token={token_a}",
                         "+trainer.lr_scheduler_kwargs={no_such_keyword: 1}", env=env,
                         cwd=tmp_path, status=1),
    }
    errors = {name: done.stderr.decode() for name, done in printed.items()}
    assert "LexerNoViableAltException: +trainer.hub_token='***" in errors["syntax error"]
    assert ("Error executing job with overrides: ['recipe=demo', 'debug=smoke', "
            "'trainer.disable_tqdm=true', '+trainer.hub_token=***'") in errors["crash"]
    assert "TypeError" in errors["crash"] and "no_such_keyword" in errors["crash"]

    contents = {f"{how} of the {name}": getattr(done, how)
                for name, done in printed.items() for how in ("stdout", "stderr")}
    paths = list(tmp_path.rglob("*"))
    contents.update({str(path): path.read_bytes() for path in paths if path.is_file()})
    for what, value in every.items():
        for path in paths:
            assert value not in path.name, f"the {what} names {path}"
        for where, content in contents.items():
            assert value.encode() not in content, f"the {what} is in {where}"

    # The sweep ran both jobs, each in a directory named by stand-ins; its record holds the
    # sweep, every value masked, and still reads as a sweep of two tokens.
    (record,) = tmp_path.glob("multirun/**/multirun.yaml")
    jobs = sorted(p.parent.relative_to(record.parent).as_posix()
                  for p in record.parent.rglob("metrics.json"))
    assert len(jobs) == 2 and all(job.startswith("demo/service.api_key=masked-") for job in jobs)
    assert len({job.split(",")[1] for job in jobs}) == 2  # the two tokens' stand-ins
    task = OmegaConf.load(record).hydra.overrides.task
    assert "+trainer.hub_token=***,***" in task and "+service.api_key=choice('***')" in task
    for job in jobs:  # each W&B run named by the same stand-ins as its directory
        (log,) = (record.parent / job / "wandb").glob("offline-run-*/run-*.wandb")
        name = read_offline_run(log.parent)["name"]
        assert "masked-" in name and all(item.split("=")[1] in name
                                         for item in job.split("/")[1].split(","))
