"""Offline is quick (bertkit.data.task_data): whether the Hub can be reached is decided once, before
the first Hub name is looked up (an offline variable, else one bounded connection to the
endpoint); without it a Hub name fails at once in one line naming the local ways, the offline
model presets of conf/model among them; a local path never asks."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import huggingface_hub.constants
import pytest
from omegaconf import OmegaConf
from transformers import AutoTokenizer, BertTokenizerFast

from bertkit.config_paths import config_dir
from bertkit.data import task_data as hub
from bertkit.errors import BertkitError
from bertkit.training.models import from_pretrained, is_hub_name, offline_ways
from tests.conftest import compose_config

SECONDS = 2.0


@pytest.fixture
def fresh_hub(monkeypatch):
    """No offline variable, no earlier answer, the job's settings as prepare_job sets them;
    whatever go_offline sets is undone after the test."""
    import datasets.config

    for name in hub.OFFLINE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", False)
    monkeypatch.setattr(hub, "_settings", {})
    monkeypatch.setattr(hub, "_reachable", {})
    hub.use_hub_settings(SECONDS, lambda: offline_ways(config_dir()))


@pytest.fixture
def connections(monkeypatch):
    """The connections the check opens (host, port), none of them to the network."""
    opened = []
    real = socket.create_connection

    def recording(address, timeout=None, *args, **kwargs):
        opened.append(address)
        if address[0] not in ("127.0.0.1", "localhost"):
            raise AssertionError(f"a connection to {address}")
        return real(address, timeout, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", recording)
    return opened


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("variable", hub.OFFLINE_VARIABLES)
def test_an_offline_variable_decides_without_a_connection(fresh_hub, connections, monkeypatch,
                                                          variable):
    monkeypatch.setenv(variable, "1")
    assert hub.require_hub() is False
    assert connections == []
    assert huggingface_hub.constants.HF_HUB_OFFLINE is True  # no retries in the libraries


def test_an_endpoint_that_refuses_is_offline_once_per_process(fresh_hub, connections,
                                                              monkeypatch):
    monkeypatch.setattr(hub, "endpoint", lambda: f"http://127.0.0.1:{_closed_port()}")
    started = time.perf_counter()
    assert hub.require_hub() is False
    assert hub.require_hub() is False
    assert time.perf_counter() - started < SECONDS
    assert len(connections) == 1
    assert huggingface_hub.constants.HF_HUB_OFFLINE is True


def test_an_endpoint_that_answers_is_online(fresh_hub, connections, monkeypatch):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setattr(hub, "endpoint", lambda: f"http://127.0.0.1:{server.getsockname()[1]}")
        assert hub.require_hub() is True
    assert len(connections) == 1
    assert huggingface_hub.constants.HF_HUB_OFFLINE is False


def test_an_endpoint_that_never_answers_is_given_up_after_hub_check_seconds(fresh_hub,
                                                                           monkeypatch):
    def hangs(address, timeout=None, *args, **kwargs):
        time.sleep(10 * SECONDS)

    monkeypatch.setattr(socket, "create_connection", hangs)
    started = time.perf_counter()
    assert hub.require_hub() is False
    assert time.perf_counter() - started < 2 * SECONDS


def test_the_check_waits_the_configured_seconds():
    cfg = compose_config([])
    assert cfg.hub_check_seconds > 0


def _offline_presets_composed() -> set[str]:
    """The model presets whose files are all local, read from each composed preset."""
    found = set()
    for path in sorted((Path(config_dir()) / "model").glob("*.yaml")):
        model = compose_config(["recipe=glue", f"model={path.stem}"]).model
        if OmegaConf.is_missing(model, "tokenizer"):
            continue
        names = [model.name_or_path, model.tokenizer]
        if all(name is None or not is_hub_name(str(name)) for name in names) and any(names):
            found.add(path.stem)
    return found


def test_a_hub_name_offline_fails_at_once_in_one_line_naming_the_local_ways(
        fresh_hub, connections, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    started = time.perf_counter()
    with pytest.raises(BertkitError) as caught:
        from_pretrained(AutoTokenizer, "bertkit-tests/not-in-the-cache", "model.tokenizer",
                        "tokenizer", trust_remote_code=False)
    assert time.perf_counter() - started < SECONDS
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("model.tokenizer=bertkit-tests/not-in-the-cache: ")
    presets = _offline_presets_composed()
    assert presets  # model=minilm_l6 at least
    for preset in presets:
        assert f"model={preset}" in message
    for way in ("model.name_or_path=<dir>", "task.data_dir=<dir>", "HF_HUB_OFFLINE"):
        assert way in message
    assert connections == []


def test_only_a_hub_name_asks_the_hub(fresh_hub, connections, vocab_dir, monkeypatch):
    """A local tokenizer loads without a connection; a Hub name then opens the one check."""
    monkeypatch.setattr(hub, "endpoint", lambda: f"http://127.0.0.1:{_closed_port()}")
    tokenizer = from_pretrained(BertTokenizerFast, str(vocab_dir), "model.tokenizer",
                                "tokenizer", trust_remote_code=False)
    assert tokenizer.vocab_size > 0
    assert connections == []
    with pytest.raises(BertkitError):
        from_pretrained(AutoTokenizer, "bertkit-tests/not-in-the-cache", "model.tokenizer",
                        "tokenizer", trust_remote_code=False)
    assert len(connections) == 1
