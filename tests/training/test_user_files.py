"""Files a user hands us are checked, and never executed (issue 48, part 4): a checkpoint whose
weights are a pickle with a payload, a folder whose config names custom code, a vocabulary
without a special token the job needs. Each is refused in one line naming the file; the
payload and the custom code never run, and nothing asks on stdin."""

from __future__ import annotations

import ast
import copy
import functools
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers.dynamic_module_utils
from omegaconf import OmegaConf
from transformers import (
    AutoModelForSequenceClassification,
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    BertTokenizerFast,
)

import bertkit
from bertkit.errors import BertkitError
from bertkit.jobs import run_job
from bertkit.pretraining.model import load_pretraining_model
from bertkit.training import models
from bertkit.training.models import (
    JOB_TOKENS,
    load_tokenizer,
    load_with_head,
)
from tests.conftest import compose_config, tiny_run_overrides

PACKAGE = Path(bertkit.__file__).parent
TINY = {"vocab_size": 40, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 16, "max_position_embeddings": 64}
# BertTokenizerFast's own special tokens by attribute (unk_token: [UNK], ...): what a
# vocab.txt-only folder is read with.
CLASS_TOKENS = {name: parameter.default for name, parameter
                in inspect.signature(BertTokenizerFast.__init__).parameters.items()
                if name in JOB_TOKENS["pretraining"]}


@functools.cache
def _preset():
    return compose_config(["recipe=glue", "model=scratch_tiny"]).model


def model_node(name_or_path=None, tokenizer=None, **extra):
    """model=scratch_tiny's node, on the given checkpoint and tokenizer."""
    node = copy.deepcopy(_preset())
    node.name_or_path = None if name_or_path is None else str(name_or_path)
    node.tokenizer = None if tokenizer is None else str(tokenizer)
    for key, value in extra.items():
        node[key] = value
    return node


def write_vocab(directory: Path, tokens: list[str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.txt").write_text("".join(f"{token}\n" for token in tokens))
    return directory


def whole_vocabulary() -> list[str]:
    return [*CLASS_TOKENS.values(), *(f"word{i}" for i in range(TINY["vocab_size"] - 5))]


# --- every load goes through the one loading function (read from bertkit's source) -------

def _calls(tree: ast.AST):
    """(call, the function it is in) for every call of the module."""
    def walk(node, function):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef,
                                                     ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Call):
                yield child, function
            yield from walk(child, inner)
    yield from walk(tree, None)


def _keywords(call: ast.Call) -> dict:
    return {keyword.arg: keyword.value for keyword in call.keywords if keyword.arg}


def test_every_load_in_bertkit_goes_through_the_one_loading_function():
    """Every `.from_pretrained(` call of bertkit is models.from_pretrained's own, which passes
    trust_remote_code (transformers asks on stdin when it is not given); every call of that
    function says trust_remote_code (no site can forget it), never a literal True; every
    torch.load reads with weights_only=True."""
    sites, helper_calls, torch_loads = [], [], []
    # bertkit and the benchmarks beside it (they load models as bertkit's jobs do)
    for path in sorted([*PACKAGE.rglob("*.py"), *(PACKAGE.parent / "benchmarks").rglob("*.py")]):
        tree = ast.parse(path.read_text(), filename=str(path))
        where = path.relative_to(PACKAGE.parent)
        for call, function in _calls(tree):
            func = call.func
            if isinstance(func, ast.Attribute) and func.attr == "from_pretrained":
                sites.append((str(where), function, call))
            elif isinstance(func, ast.Name) and func.id == "from_pretrained":
                helper_calls.append((f"{where}:{call.lineno}", call))
            elif isinstance(func, ast.Attribute) and func.attr == "load" \
                    and isinstance(func.value, ast.Name) and func.value.id == "torch":
                torch_loads.append((f"{where}:{call.lineno}", call))
    assert [(where, function) for where, function, _ in sites] == [
        ("bertkit/training/models.py", "from_pretrained")], sites
    assert "trust_remote_code" in _keywords(sites[0][2])
    # the models, configs and tokenizers of every job, the benchmarks and two-stage runs
    assert len(helper_calls) >= 8, helper_calls
    for where, call in helper_calls:
        trust = _keywords(call).get("trust_remote_code")
        assert trust is not None, f"{where}: from_pretrained without trust_remote_code"
        assert not (isinstance(trust, ast.Constant) and trust.value is True), where
    for where, call in torch_loads:
        weights = _keywords(call).get("weights_only")
        assert isinstance(weights, ast.Constant) and weights.value is True, where


# --- weights: safetensors or plain tensors; a pickle with a payload is refused ---------------

class Payload:
    """A pickled object whose unpickling writes the marker file: code run by torch.load."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').write('ran')",)


def tiny_checkpoint(directory: Path, payload_marker: Path | None = None) -> Path:
    """A BERT folder whose weights are pytorch_model.bin (a pickle), with a payload or not."""
    model = BertModel(BertConfig(**TINY))
    model.config.save_pretrained(directory)
    state = dict(model.state_dict())
    if payload_marker is not None:
        state["payload"] = Payload(payload_marker)
    torch.save(state, directory / "pytorch_model.bin")
    return directory


LOADS = {
    "finetuning": lambda node, tokenizer: load_with_head(
        node, tokenizer, AutoModelForSequenceClassification, BertForSequenceClassification,
        {"num_labels": 2}),
    "pretraining": load_pretraining_model,
}


@pytest.mark.parametrize("job", sorted(LOADS))
def test_a_pickle_with_a_payload_is_refused_naming_it_and_never_runs(job, tmp_path):
    tokenizer = BertTokenizerFast(str(write_vocab(tmp_path / "vocab", whole_vocabulary())
                                      / "vocab.txt"))
    plain = tiny_checkpoint(tmp_path / "plain")
    assert LOADS[job](model_node(plain), tokenizer) is not None  # plain tensors: read
    marker = tmp_path / "payload-ran"
    folder = tiny_checkpoint(tmp_path / "pickled", payload_marker=marker)
    with pytest.raises(BertkitError) as error:
        LOADS[job](model_node(folder), tokenizer)
    message = str(error.value)
    assert message.startswith(f"model.name_or_path={folder}: {folder / 'pytorch_model.bin'} is "
                              f"a pickle holding more than tensors (it names exec), refused: "
                              f"bertkit reads weights only as safetensors"), message
    assert "\n" not in message and "weights_only" not in message, message  # torch's advice
    assert not marker.exists()


# --- custom code: refused unless model.trust_remote_code, and nothing asks on stdin ----------

CUSTOM_MODULE = """\
open({marker!r}, "w").write("ran")
from transformers import BertConfig, BertForSequenceClassification


class CustomConfig(BertConfig):
    model_type = {model_type!r}


class CustomModel(BertForSequenceClassification):
    config_class = CustomConfig
"""


def custom_code_folder(directory: Path, marker: Path, model_type: str = "bert") -> Path:
    """A checkpoint whose config.json (and tokenizer_config.json) name custom.py, whose import
    writes the marker."""
    BertModel(BertConfig(**TINY)).save_pretrained(directory)
    config = json.loads((directory / "config.json").read_text())
    config["model_type"] = model_type
    config["auto_map"] = {"AutoConfig": "custom.CustomConfig",
                          "AutoModelForSequenceClassification": "custom.CustomModel"}
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "custom.py").write_text(CUSTOM_MODULE.format(marker=str(marker),
                                                              model_type=model_type))
    return directory


def custom_tokenizer_folder(directory: Path) -> Path:
    BertTokenizerFast(str(write_vocab(directory, whole_vocabulary()) / "vocab.txt")
                      ).save_pretrained(directory)
    settings = json.loads((directory / "tokenizer_config.json").read_text())
    settings["auto_map"] = {"AutoTokenizer": [None, "custom.CustomTokenizer"]}
    (directory / "tokenizer_config.json").write_text(json.dumps(settings))
    return directory


@pytest.mark.parametrize("load", ["finetuning", "pretraining", "tokenizer"])
def test_a_folder_naming_custom_code_is_refused_naming_the_file(load, tmp_path):
    marker = tmp_path / "custom-code-ran"
    vocab = write_vocab(tmp_path / "vocab", whole_vocabulary())
    if load == "tokenizer":
        folder = custom_tokenizer_folder(tmp_path / "custom")
        key, named = "model.tokenizer", folder / "tokenizer_config.json"
        call = lambda: load_tokenizer(model_node(tokenizer=folder))  # noqa: E731
    else:
        folder = custom_code_folder(tmp_path / "custom", marker)
        key, named = "model.name_or_path", folder / "config.json"
        tokenizer = BertTokenizerFast(str(vocab / "vocab.txt"))
        call = {job: (lambda job=job: LOADS[job](model_node(folder), tokenizer))
                for job in LOADS}[load]
    with pytest.raises(BertkitError) as error:
        call()
    message = str(error.value)
    assert message.startswith(f"{key}={folder}: {named} names custom code in its auto_map "
                              f"(custom."), message
    assert message.endswith("or read that code and set model.trust_remote_code=true")
    assert "\n" not in message
    assert not marker.exists()


def test_model_trust_remote_code_true_lets_the_folder_code_run(tmp_path, monkeypatch):
    """The documented key reaches transformers: the custom class is what is loaded."""
    monkeypatch.setattr(transformers.dynamic_module_utils, "HF_MODULES_CACHE",
                        str(tmp_path / "modules"))
    monkeypatch.syspath_prepend(str(tmp_path / "modules"))
    marker = tmp_path / "custom-code-ran"
    folder = custom_code_folder(tmp_path / "custom", marker, model_type="custom-bert")
    tokenizer = BertTokenizerFast(str(write_vocab(tmp_path / "vocab", whole_vocabulary())
                                      / "vocab.txt"))
    loaded = LOADS["finetuning"](model_node(folder, trust_remote_code=True), tokenizer)
    assert type(loaded).__name__ == "CustomModel" and marker.exists()


@pytest.mark.slow
def test_the_command_never_asks_to_run_custom_code(tmp_path, glue_dir, vocab_dir):
    """A config whose model_type transformers does not know made it ask "Do you wish to run
    the custom code? [y/N]" on stdin; a user (or a pipe) answering y ran it. Now: refused in
    one line, stdin never read, the code never run."""
    marker = tmp_path / "custom-code-ran"
    folder = custom_code_folder(tmp_path / "custom", marker, model_type="custom-bert")
    overrides = tiny_run_overrides("rte", glue_dir("rte"), vocab_dir,
                                   **{"model.name_or_path": str(folder),
                                      "hydra.run.dir": str(tmp_path / "run")})
    env = {**os.environ, "WANDB_MODE": "disabled",
           "HF_MODULES_CACHE": str(tmp_path / "modules")}
    env.pop("HYDRA_FULL_ERROR", None)
    result = subprocess.run([sys.executable, "-m", "bertkit", *overrides], input="y\ny\ny\n",
                            capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "[y/N]" not in output and "Traceback" not in output, output
    assert (f"bertkit: error: model.name_or_path={folder}: {folder / 'config.json'} names "
            f"custom code in its auto_map (custom.CustomConfig, custom.CustomModel)") in output
    assert not marker.exists()


# --- vocabularies: the special tokens the job feeds the model are there -------------------

def saved_tokenizer(directory: Path, tokens: list[str]) -> Path:
    """A tokenizer folder as save_pretrained writes it (tokenizer.json read first)."""
    BertTokenizerFast(str(write_vocab(directory / "source", tokens) / "vocab.txt")
                      ).save_pretrained(directory)
    return directory


LAYOUTS = {"vocab.txt": write_vocab, "tokenizer.json": saved_tokenizer}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("role", JOB_TOKENS["pretraining"])
def test_a_vocabulary_missing_a_special_token_is_refused_naming_it(role, layout, tmp_path):
    token = CLASS_TOKENS[role]
    tokens = [item for item in whole_vocabulary() if item != token]
    folder = LAYOUTS[layout](tmp_path / "vocab", tokens)
    needs = [job for job, roles in JOB_TOKENS.items() if role in roles]
    for job in JOB_TOKENS:
        node = model_node(tokenizer=folder)
        if job not in needs:  # a token the job does not use may be absent
            assert load_tokenizer(node, job=job) is not None
            continue
        with pytest.raises(BertkitError) as error:
            load_tokenizer(node, job=job)
        assert str(error.value) == (f"model.tokenizer={folder}: {folder / layout} lacks the "
                                    f"special token {token} ({role}) that {job} feeds the "
                                    f"model; add it to the vocabulary")


def test_an_empty_vocab_txt_ends_the_run_in_one_line(tmp_path, glue_dir):
    """Was `Exception: WordPiece error: Missing [UNK] token from the vocabulary` with a
    traceback, once the features were being built."""
    vocab = write_vocab(tmp_path / "vocab", [])
    cfg = compose_config(tiny_run_overrides("rte", glue_dir("rte"), vocab,
                                            cache_dir=tmp_path / "cache"))
    with pytest.raises(BertkitError) as error:
        run_job(cfg, run_dir=tmp_path / "run")
    missing = ", ".join(f"{CLASS_TOKENS[role]} ({role})" for role in JOB_TOKENS["finetuning"])
    assert str(error.value) == (f"model.tokenizer={vocab}: {vocab / 'vocab.txt'} lacks the "
                                f"special tokens {missing} that finetuning feeds the model; "
                                f"add them to the vocabulary")


def test_the_trust_key_is_in_every_model_preset_and_false():
    for path in sorted((PACKAGE.parent / "conf" / "model").glob("*.yaml")):
        model = compose_config(["recipe=glue", f"model={path.stem}"]).model
        assert OmegaConf.select(model, "trust_remote_code") is False, path.stem
        assert models.trusts_remote_code(model) is False
