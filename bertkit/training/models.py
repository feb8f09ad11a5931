"""Tokenizer and BERT model from a Hub id, a local checkpoint, or a config trained from
scratch, with the attention kernel the model runs.
"""

from __future__ import annotations

import importlib.util
import json
import pickle
import re
from pathlib import Path

import torch
from huggingface_hub import try_to_load_from_cache
from omegaconf import DictConfig, OmegaConf
from transformers import (
    AutoConfig,
    AutoTokenizer,
    BertConfig,
    BertTokenizerFast,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.tokenization_utils_base import TOKENIZER_CONFIG_FILE
from transformers.utils import CONFIG_NAME, WEIGHTS_NAME, cached_file

from bertkit.data.atomic_files import read_json
from bertkit.data.task_data import offline_error, require_hub
from bertkit.errors import BertkitError

# ================================================================================================
# Which attention kernel the model runs (model.attn_implementation), chosen once per run.
#
# auto: FlashAttention-2 where its package is installed and a GPU runs the model, because with
# a padded batch transformers then runs it on the real tokens only (varlen: the padding is cut
# out before attention and put back after); PyTorch's fused SDPA everywhere else (CPU, or no
# flash_attn). An explicit value (eager, sdpa, flash_attention_2, flex_attention) is passed to
# transformers as it is.

CHOICES = ("auto", "eager", "sdpa", "flash_attention_2", "flex_attention")


def attention_implementation(setting: str | None) -> str:
    """`setting` is one of CHOICES (the schema's, bertkit.config_schema), or None: auto."""
    setting = setting or "auto"
    if setting != "auto":
        return setting
    if torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"


# ================================================================================================
# Tokenizer and BERT model from a Hub id, a local checkpoint, or a config trained from scratch.
# Each family adds its own head through load_with_head (bertkit/tasks/<family>/models.py).
#
# Every checkpoint, config and tokenizer bertkit reads goes through `from_pretrained` here: the
# files a user hands us are data, never code. A folder whose config names custom code (an
# auto_map) is refused unless model.trust_remote_code is true, and transformers is told so
# (it would otherwise ask "Do you wish to run the custom code? [y/N]" on stdin); weights are
# read as safetensors or plain tensors (weights_only), and a pickle that needs more is refused
# naming the file; a vocabulary lacking a special token the job feeds the model is refused
# naming the file and the token (it was a tokenizers traceback at the first unknown word).

# The special tokens each job feeds the model, named by the tokenizer's attributes (the
# strings are the tokenizer's own: BertTokenizerFast's [UNK] [CLS] [SEP] [PAD] [MASK]).
# Pretraining masks tokens whatever its objective (every objective has the masked LM).
JOB_TOKENS = {"finetuning": ("unk_token", "cls_token", "sep_token", "pad_token"),
              "pretraining": ("unk_token", "cls_token", "sep_token", "pad_token",
                              "mask_token")}
# Where each kind of load finds the custom code transformers would run: (file, its auto_map
# entry; None: any entry). AutoTokenizer reads tokenizer_config.json's auto_map, and
# config.json's AutoTokenizer entry; a model or config, any entry of config.json's.
CODE_ENTRIES = {"tokenizer": ((TOKENIZER_CONFIG_FILE, None), (CONFIG_NAME, "AutoTokenizer")),
                "model": ((CONFIG_NAME, None),), "config": ((CONFIG_NAME, None),)}


def hub_error(what: str, name: str, key: str, err: Exception) -> BertkitError:
    first_line = str(err).splitlines()[0] if str(err) else type(err).__name__
    return BertkitError(
        f"{key}={name}: could not load the {what} ({first_line}). Without network, give a "
        f"local directory (a saved checkpoint, or one holding a WordPiece vocab.txt or "
        f"tokenizer.json)"
    )


def _is_local_path(name: str) -> bool:
    """A directory, not a Hub id (which is `name` or `owner/name`)."""
    return Path(name).is_absolute() or name.startswith((".", "~")) or name.count("/") > 1


def is_hub_name(name: str) -> bool:
    """A name transformers would look up on the Hub: not a local path, not an existing one."""
    return not _is_local_path(name) and not Path(name).expanduser().exists()


# Model presets (conf/model/) that run without the Hub: every file they name is local.
MODEL_KEYS = ("name_or_path", "tokenizer")


def _preset(path: Path) -> DictConfig:
    """A conf/model preset with the presets its defaults list names merged in, as Hydra
    composes the group. Not Hydra's compose: a whole config per preset takes about 0.2 s, and
    an offline error that names the presets must come at once."""
    own = OmegaConf.load(path)
    defaults = list(own.pop("defaults", None) or [])
    if "_self_" not in defaults:
        defaults.append("_self_")
    merged = OmegaConf.create({})
    for entry in defaults:
        part = own if entry == "_self_" else _preset(path.with_name(f"{entry}.yaml"))
        merged = OmegaConf.merge(merged, part)
    return merged


def offline_model_presets(config_directory: str) -> dict[str, str | None]:
    """The presets of conf/model/ whose checkpoint and tokenizer are both local paths or
    unset, each with the command that fetches its files (model.fetch.command), read from the
    files, not listed by hand. A preset whose tokenizer is left for the user (???) needs one
    and is not listed."""
    presets = {}
    for path in sorted((Path(config_directory) / "model").glob("*.yaml")):
        node = OmegaConf.create({"cache_dir": "/cache", "model": _preset(path)})
        if any(OmegaConf.is_missing(node.model, key) for key in MODEL_KEYS):
            continue
        values = [OmegaConf.select(node, f"model.{key}") for key in MODEL_KEYS]
        if any(values) and all(v is None or not is_hub_name(str(v)) for v in values):
            presets[path.stem] = OmegaConf.select(node, "model.fetch.command")
    return presets


def offline_ways(config_directory: str) -> str:
    """The local ways an offline error names (bertkit.data.task_data.offline_error)."""
    presets = "".join(f"model={name}{f' (after `{fetch}`)' if fetch else ''}, "
                      for name, fetch in offline_model_presets(config_directory).items())
    return (f"{presets}model.name_or_path=<dir> (a saved checkpoint), task.data_dir=<dir> "
            f"(a task's original files)")


def check_local_files(model: DictConfig, fetched_only: bool = False) -> None:
    """A checkpoint or vocabulary directory that is not there is refused naming the key and
    how to get it: model.fetch.command when the path is the preset's model.fetch.directory
    (model=minilm_l6 before `make minilm`), else what may be given instead. Without this, the
    path went on to the Hub as a model id, whose error said nothing of missing files.
    `fetched_only`: only the preset's fetched directory (at the start of a job, when a demo's
    vocabulary or a first stage's checkpoint is not written yet)."""
    fetch = OmegaConf.select(model, "fetch")
    for key in ("name_or_path", "tokenizer"):
        if OmegaConf.is_missing(model, key):
            continue
        name = OmegaConf.select(model, key)
        fetched = fetch is not None and name is not None and str(name) == str(fetch.directory)
        if not name or (fetched_only and not fetched) or not _is_local_path(str(name)) \
                or Path(str(name)).expanduser().exists():
            continue
        how = (f"`{fetch.command}` puts the files there" if fetched
               else "give a saved checkpoint's directory, or a Hub id")
        raise BertkitError(f"model.{key}={name}: no such directory; {how}")


def trusts_remote_code(model: DictConfig) -> bool:
    """model.trust_remote_code: whether code that a checkpoint or tokenizer folder ships may
    run; false unless the user sets it (a node without the key, too)."""
    return model.trust_remote_code is True


def _custom_code(name: str, file_name: str, entry: str | None,
                 local_files_only: bool = False) -> tuple[str, list[str]]:
    """(the file, the classes its auto_map names) for the custom code in `name`'s file_name;
    no classes when it names none or the file is not there (the load then says why).
    `local_files_only`: the Hub cache only, as the load it guards (no network round trips)."""
    try:
        found = cached_file(name, file_name, _raise_exceptions_for_missing_entries=False,
                            _raise_exceptions_for_connection_errors=False,
                            local_files_only=local_files_only)
    except (OSError, ValueError):  # a Hub id that does not resolve: the load reports it
        found = None
    if found is None:
        return file_name, []
    auto_map = read_json(found).get("auto_map") or {}
    if not isinstance(auto_map, dict):
        auto_map = {"auto_map": auto_map}
    named = [auto_map.get(entry)] if entry else list(auto_map.values())
    classes = [item for value in named
               for item in (value if isinstance(value, list) else [value]) if item]
    return found, [str(item) for item in classes]


def refuse_custom_code(name: str, key: str, what: str, local_files_only: bool = False) -> None:
    """A folder (or Hub id) whose config names code of its own is refused, naming the file:
    with model.trust_remote_code false, transformers would ignore that code and load plain
    BERT (another model than the folder's) or stop to ask on stdin."""
    for file_name, entry in CODE_ENTRIES[what]:
        found, classes = _custom_code(name, file_name, entry, local_files_only)
        if classes:
            raise BertkitError(
                f"{key}={name}: {found} names custom code in its auto_map "
                f"({', '.join(dict.fromkeys(classes))}), which bertkit does not run: give a "
                f"checkpoint of transformers' own BERT, or read that code and set "
                f"model.trust_remote_code=true")


def _plain_tensors(path: Path) -> bool:
    """Whether torch reads the file with weights_only (tensors and plain containers only)."""
    try:
        torch.load(path, map_location="meta", weights_only=True)
    except pickle.UnpicklingError:
        return False
    except (OSError, RuntimeError, EOFError, ValueError):  # another fault than the refused one
        return True
    return True


def pickled_weights(name: str, key: str, err: pickle.UnpicklingError) -> BertkitError:
    """A weights file that needs unpickling Python objects, in one line naming it. torch's own
    message advises weights_only=False, which runs whatever the pickle calls: never said."""
    folder = Path(name).expanduser()
    if folder.is_dir():
        files = sorted(folder.glob("*.bin"))
    else:
        cached = try_to_load_from_cache(name, WEIGHTS_NAME)
        files = [Path(cached)] if isinstance(cached, str) else []
    refused = [path for path in files if not _plain_tensors(path)] or files
    where = ", ".join(str(path) for path in refused) or f"the weights of {name}"
    called = re.search(r"GLOBAL (\S+)", str(err))
    names = f" (it names {called.group(1)})" if called else ""
    return BertkitError(
        f"{key}={name}: {where} is a pickle holding more than tensors{names}, refused: bertkit "
        f"reads weights only as safetensors or plain tensors; save the checkpoint as "
        f"model.safetensors")


def from_pretrained(loader, name: str, key: str, what: str, *, trust_remote_code: bool,
                    **kwargs):
    """loader.from_pretrained(name) for `what` (a model, config or tokenizer) under the rules
    of a file a user hands us (above); `key` is the setting that named it, for messages.
    trust_remote_code is always passed: transformers asks on stdin when it is not. A Hub
    name is looked up only once the Hub is known reachable (bertkit.data.task_data: else offline
    mode, and one line naming the local ways when it is not in the Hub cache)."""
    online = (kwargs.get("local_files_only") or not is_hub_name(name)) or require_hub()
    if not trust_remote_code:
        refuse_custom_code(name, key, what, bool(kwargs.get("local_files_only")))
    weights = {"weights_only": True} if what == "model" else {}
    try:
        return loader.from_pretrained(name, trust_remote_code=trust_remote_code, **weights,
                                      **kwargs)
    except pickle.UnpicklingError as err:
        raise pickled_weights(name, key, err) from None
    except (OSError, ValueError) as err:
        if not online:
            raise offline_error(f"{key}={name}", f"the {what}") from None
        raise hub_error(what, name, key, err) from None


def _vocabulary_file(name: str) -> str:
    """The file a tokenizer's vocabulary was read from, for messages."""
    folder = Path(name).expanduser()
    for file_name in ("tokenizer.json", "vocab.txt"):
        if (folder / file_name).is_file():
            return str(folder / file_name)
    return f"the vocabulary of {name}"


def check_special_tokens(tokenizer: PreTrainedTokenizerBase, name: str, job: str) -> None:
    """The special tokens `job` feeds the model are in the vocabulary itself: a missing one is
    added by transformers beside it (an id the checkpoint's embeddings may not have), and a
    missing [UNK] ends the run at the first unknown word in a tokenizers traceback."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    vocabulary = (backend.get_vocab(with_added_tokens=False) if backend is not None
                  else tokenizer.get_vocab())
    missing = []
    for role in JOB_TOKENS[job]:
        token = getattr(tokenizer, role, None)
        if token is None or str(token) not in vocabulary:
            missing.append(f"{token} ({role})" if token else role)
    if missing:
        raise BertkitError(
            f"model.tokenizer={name}: {_vocabulary_file(name)} lacks the special "
            f"token{'s' if len(missing) > 1 else ''} {', '.join(missing)} that {job} feeds "
            f"the model; add {'them' if len(missing) > 1 else 'it'} to the vocabulary")


# tokenizer_config.json's tokenizer_class values that name no tokenizer of a model: the generic
# backend (transformers 5) and its older name. AutoTokenizer gives such a folder, or one naming
# no class, no special-token roles and no token_type_ids (a pair's segment B read as A).
GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def _wordpiece_file(folder: Path) -> bool:
    """The folder's vocabulary is WordPiece (BERT's): tokenizer.json's model, else vocab.txt."""
    if (folder / "tokenizer.json").is_file():
        spec = read_json(folder / "tokenizer.json")
        return isinstance(spec.get("model"), dict) and spec["model"].get("type") == "WordPiece"
    return (folder / "vocab.txt").is_file()


def tokenizer_loader(folder: Path):
    """BertTokenizerFast for a folder holding a WordPiece vocabulary that names no tokenizer
    class of its own (vocab.txt or tokenizer.json alone, or beside a tokenizer_config.json or
    config.json that names none): BERT's special tokens and token types, as for Google's
    vocab.txt. AutoTokenizer for a folder that names its class (a saved tokenizer or model),
    which it reads as that class."""
    settings_file = folder / TOKENIZER_CONFIG_FILE
    settings = read_json(settings_file) if settings_file.is_file() else {}
    named = settings.get("tokenizer_class")
    if settings.get("auto_map") or (named and named not in GENERIC_TOKENIZER_CLASSES):
        return AutoTokenizer
    if not named and (folder / CONFIG_NAME).is_file():  # the model type names the class
        return AutoTokenizer
    return BertTokenizerFast if _wordpiece_file(folder) else AutoTokenizer


def load_tokenizer(model: DictConfig, job: str = "finetuning") -> PreTrainedTokenizerBase:
    """The tokenizer of model.tokenizer, read as tokenizer_loader says; the special tokens
    `job` uses (JOB_TOKENS) must be in the vocabulary."""
    check_local_files(model)
    if OmegaConf.is_missing(model, "tokenizer") or model.tokenizer is None:
        raise BertkitError("model.tokenizer is not set: give a Hub id or a directory holding "
                           "a WordPiece vocab.txt or tokenizer.json")
    name = str(model.tokenizer)
    path = Path(name).expanduser()
    if path.is_file():
        raise BertkitError(f"model.tokenizer={name}: expected a directory or a Hub id, got a file")
    if path.is_dir():
        if not any((path / file_name).is_file() for file_name in
                   ("vocab.txt", "tokenizer.json", TOKENIZER_CONFIG_FILE)):
            raise BertkitError(f"model.tokenizer={name}: the directory has no vocab.txt or "
                               f"tokenizer.json")
        loader = tokenizer_loader(path)
    else:
        loader = AutoTokenizer
    tokenizer = from_pretrained(loader, name, "model.tokenizer", "tokenizer",
                                trust_remote_code=trusts_remote_code(model),
                                do_lower_case=model.do_lower_case)
    check_special_tokens(tokenizer, name, job)
    # Old checkpoints (e.g. Google's bert-base-uncased tokenizer_config.json) carry no
    # model_max_length, which would leave truncation unbounded.
    # (A model.config without it: BertConfig's own default, the length the model is built with.)
    limit = model.config.get("max_position_embeddings") or BertConfig().max_position_embeddings
    if tokenizer.model_max_length > limit:
        tokenizer.model_max_length = limit
    return tokenizer


def dropout_settings(model: DictConfig) -> dict:
    return {"hidden_dropout_prob": model.hidden_dropout_prob,
            "attention_probs_dropout_prob": model.attention_probs_dropout_prob}


def attention_setting(model: DictConfig) -> dict:
    """The attention kernel for from_pretrained / the config (model.attn_implementation)."""
    return {"attn_implementation": attention_implementation(
        OmegaConf.select(model, "attn_implementation"))}


def count_parameters(model: PreTrainedModel) -> int:
    """The model's parameters as saved: a pretraining model's vocabulary padding rows
    (bertkit.pretraining.model, pad_vocabulary) are left out, as its checkpoints leave them."""
    return sum(p.numel() for p in model.parameters()) - getattr(
        model, "vocab_padding_parameters", 0)


def load_with_head(model: DictConfig, tokenizer: PreTrainedTokenizerBase, auto_class,
                    bert_class, head: dict) -> PreTrainedModel:
    """A checkpoint (Hub id or directory) with a new task head, or BERT from model.config."""
    dropout = dropout_settings(model)
    if model.name_or_path:
        name = str(model.name_or_path)
        trusted = trusts_remote_code(model)
        config = from_pretrained(AutoConfig, name, "model.name_or_path", "config",
                                 trust_remote_code=trusted, **head, **dropout)
        return from_pretrained(auto_class, name, "model.name_or_path", "model",
                               trust_remote_code=trusted, config=config,
                               **attention_setting(model))
    config = BertConfig(
        pad_token_id=tokenizer.pad_token_id,
        # model.config.vocab_size, when given, wins (check_model_settings held it to the
        # tokenizer's size): e.g. a multiple of 64 for tensor cores.
        **{"vocab_size": len(tokenizer), **OmegaConf.to_container(model.config)},
        **head,
        **dropout,
        **attention_setting(model),
    )
    return bert_class(config)


# BertConfig's keys the rules between settings read (check_model_settings), from model.config
# for a model trained from scratch or from a checkpoint's config.json.
SHAPE_KEYS = ("hidden_size", "num_attention_heads", "max_position_embeddings",
              "type_vocab_size", "vocab_size")
SEGMENTS_OF_A_PAIR = 2  # token types 0 and 1: [CLS] A [SEP] B [SEP]


def _checkpoint_config(model: DictConfig, local_only: bool) -> dict | None:
    """A checkpoint's config.json as a dict: read from a local directory, else through
    AutoConfig (from the Hub cache only when `local_only`); None when it cannot be had yet."""
    name = str(model.name_or_path)
    if not trusts_remote_code(model):  # a folder of custom code is refused first, as it loads
        refuse_custom_code(name, "model.name_or_path", "config", local_files_only=local_only)
    path = Path(name).expanduser()
    if (path / "config.json").is_file():
        try:
            return json.loads((path / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None  # loading the checkpoint says what is wrong with it
    if path.exists() or _is_local_path(name):
        return None
    try:
        return from_pretrained(AutoConfig, name, "model.name_or_path", "config",
                               trust_remote_code=trusts_remote_code(model),
                               local_files_only=local_only).to_dict()
    except BertkitError:
        if local_only:
            return None
        raise


def model_shape(model: DictConfig, local_only: bool = True) -> dict[str, tuple[int, str]]:
    """SHAPE_KEYS -> (value, the setting that gives it, as a message names it): model.config's
    (BertConfig's defaults where a key is left out) for a model from scratch, the checkpoint's
    config.json for model.name_or_path. vocab_size is absent where the tokenizer's size
    decides it (from scratch without model.config.vocab_size); all are absent for a checkpoint
    whose config.json is not at hand (a Hub id not in the cache, when `local_only`)."""
    defaults = BertConfig().to_dict()
    if model.name_or_path:
        name = str(model.name_or_path)
        config = _checkpoint_config(model, local_only)
        if config is None:
            return {}
        return {key: (config.get(key, defaults[key]),
                      f"model.name_or_path={name}'s config.json {key}") for key in SHAPE_KEYS}
    given = model.config or {}
    return {key: (given[key] if key in given else defaults[key], f"model.config.{key}")
            for key in SHAPE_KEYS if key != "vocab_size" or key in given}


def tokenizer_size(model: DictConfig) -> int | None:
    """The ids the tokenizer of model.tokenizer hands the model (its largest + 1), read from
    its files without loading it (vocab.txt's lines, tokenizer.json's vocabulary and added
    tokens); None when they are not on disk yet (a Hub id, a vocabulary a run writes)."""
    if OmegaConf.is_missing(model, "tokenizer") or not model.tokenizer:
        return None
    path = Path(str(model.tokenizer)).expanduser()
    try:
        if (path / "tokenizer.json").is_file():
            spec = json.loads((path / "tokenizer.json").read_text(encoding="utf-8"))
            vocab = (spec.get("model") or {}).get("vocab") or {}
            ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab)))
            ids += [token["id"] for token in spec.get("added_tokens") or []]
            return max(ids) + 1 if ids else None
        if (path / "vocab.txt").is_file():
            with (path / "vocab.txt").open(encoding="utf-8") as lines:
                return sum(1 for _ in lines) or None
    except (OSError, ValueError, TypeError, KeyError):
        return None  # load_tokenizer says what is wrong with the files
    return None


def _settable(where: str) -> bool:
    """A size the user sets (model.config.*), not a checkpoint's own."""
    return where.startswith("model.config.")


def check_vocabulary(model: DictConfig, tokens: int | None,
                     shape: dict[str, tuple[int, str]] | None = None) -> None:
    """Every id the tokenizer gives must have a row of the word embeddings (else an
    IndexError in the embedding lookup at the first step)."""
    shape = model_shape(model) if shape is None else shape
    if tokens is None or "vocab_size" not in shape:
        return
    size, where = shape["vocab_size"]
    if size < tokens:
        fix = (f"raise {where} to at least {tokens}, or leave it out (the tokenizer's size)"
               if _settable(where) else "give the checkpoint's own tokenizer")
        raise BertkitError(f"{where}={size} is below the {tokens} tokens of "
                           f"model.tokenizer={model.tokenizer}: {fix}")


def check_model_settings(model: DictConfig, lengths: dict[str, int],
                         second_segment: str | None, tokens: int | None,
                         local_only: bool = True) -> None:
    """The model's own rules against the run's other settings, before data or models load,
    each broken one said in one line naming both keys: the hidden size a multiple of the
    attention heads (else BertSelfAttention's ValueError), two token types where the run
    feeds a second segment (`second_segment`: the setting that does, e.g.
    task.columns.text_b=sentence2; else an IndexError in the token-type embeddings), as many
    positions as each sequence length (`lengths`: key -> length) and a word embedding for each
    of the tokenizer's ids (`tokens`, None when not known). Whatever is not known yet
    (a Hub checkpoint not in the cache, a vocabulary the run writes) is checked again by the
    caller once it is loaded."""
    shape = model_shape(model, local_only)
    if not shape:
        return
    (hidden, hidden_key), (heads, heads_key) = shape["hidden_size"], \
        shape["num_attention_heads"]
    if hidden % heads:
        raise BertkitError(f"{hidden_key}={hidden} is not a multiple of {heads_key}={heads}: "
                           f"each head gets hidden_size / num_attention_heads dimensions; pick "
                           f"a number of heads that divides {hidden}")
    types, types_key = shape["type_vocab_size"]
    if second_segment is not None and types < SEGMENTS_OF_A_PAIR:
        fix = (f"raise {types_key} to {SEGMENTS_OF_A_PAIR}" if _settable(types_key)
               else "give a checkpoint trained on sentence pairs")
        raise BertkitError(f"{types_key}={types} is below the {SEGMENTS_OF_A_PAIR} token types "
                           f"of {second_segment}, which feeds the model a second segment: {fix}")
    limit, where = shape["max_position_embeddings"]
    for key, length in lengths.items():  # named by the key the user set, not the model's
        if length > limit:
            raise BertkitError(f"{key}={length} exceeds the {limit} positions of {where}: "
                               f"lower {key} to at most {limit}"
                               + (f", or raise {where}" if _settable(where) else ""))
    check_vocabulary(model, tokens, shape)
