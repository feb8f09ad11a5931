"""Tokenizer and BERT model from a Hub id, a local checkpoint, or a config trained from scratch.
Each family adds its own head through load_with_head (bertkit/tasks/<family>/models.py)."""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from transformers import (
    AutoConfig,
    AutoTokenizer,
    BertConfig,
    BertTokenizerFast,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from bertkit.errors import BertkitError
from bertkit.training.attention import attention_implementation


def hub_error(what: str, name: str, key: str, err: Exception) -> BertkitError:
    first_line = str(err).splitlines()[0] if str(err) else type(err).__name__
    return BertkitError(
        f"{key}={name}: could not load the {what} ({first_line}). Without network, give a "
        f"local directory (a saved checkpoint, or one holding a WordPiece vocab.txt)"
    )


def _is_local_path(name: str) -> bool:
    """A directory, not a Hub id (which is `name` or `owner/name`)."""
    return Path(name).is_absolute() or name.startswith((".", "~")) or name.count("/") > 1


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


def load_tokenizer(model: DictConfig) -> PreTrainedTokenizerBase:
    """A directory holding only vocab.txt (Google's layout) is read as a BERT WordPiece vocab."""
    check_local_files(model)
    if OmegaConf.is_missing(model, "tokenizer") or model.tokenizer is None:
        raise BertkitError("model.tokenizer is not set: give a Hub id or a directory holding "
                           "a WordPiece vocab.txt")
    name = str(model.tokenizer)
    path = Path(name)
    if path.is_dir() and not (path / "tokenizer.json").is_file() \
            and not (path / "tokenizer_config.json").is_file():
        if not (path / "vocab.txt").is_file():
            raise BertkitError(f"model.tokenizer={name}: the directory has no vocab.txt")
        tokenizer = BertTokenizerFast.from_pretrained(str(path), do_lower_case=model.do_lower_case)
    elif path.is_file():
        raise BertkitError(f"model.tokenizer={name}: expected a directory or a Hub id, got a file")
    else:
        try:
            tokenizer = AutoTokenizer.from_pretrained(name, do_lower_case=model.do_lower_case)
        except (OSError, ValueError) as err:
            raise hub_error("tokenizer", name, "model.tokenizer", err) from None
    # Old checkpoints (e.g. Google's bert-base-uncased tokenizer_config.json) carry no
    # model_max_length, which would leave truncation unbounded.
    limit = OmegaConf.select(model, "config.max_position_embeddings", default=512)
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
    return sum(p.numel() for p in model.parameters())


def load_with_head(model: DictConfig, tokenizer: PreTrainedTokenizerBase, auto_class,
                    bert_class, head: dict) -> PreTrainedModel:
    """A checkpoint (Hub id or directory) with a new task head, or BERT from model.config."""
    dropout = dropout_settings(model)
    if model.name_or_path:
        name = str(model.name_or_path)
        try:
            config = AutoConfig.from_pretrained(name, **head, **dropout)
            return auto_class.from_pretrained(name, config=config, **attention_setting(model))
        except (OSError, ValueError) as err:
            raise hub_error("model", name, "model.name_or_path", err) from None
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


def _checkpoint_config(name: str, local_only: bool) -> dict | None:
    """A checkpoint's config.json as a dict: read from a local directory, else through
    AutoConfig (from the Hub cache only when `local_only`); None when it cannot be had yet."""
    path = Path(name).expanduser()
    if (path / "config.json").is_file():
        try:
            return json.loads((path / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None  # loading the checkpoint says what is wrong with it
    if path.exists() or _is_local_path(name):
        return None
    try:
        return AutoConfig.from_pretrained(name, local_files_only=local_only).to_dict()
    except (OSError, ValueError) as err:
        if local_only:
            return None
        raise hub_error("model", name, "model.name_or_path", err) from None


def model_shape(model: DictConfig, local_only: bool = True) -> dict[str, tuple[int, str]]:
    """SHAPE_KEYS -> (value, the setting that gives it, as a message names it): model.config's
    (BertConfig's defaults where a key is left out) for a model from scratch, the checkpoint's
    config.json for model.name_or_path. vocab_size is absent where the tokenizer's size
    decides it (from scratch without model.config.vocab_size); all are absent for a checkpoint
    whose config.json is not at hand (a Hub id not in the cache, when `local_only`)."""
    defaults = BertConfig().to_dict()
    if model.name_or_path:
        name = str(model.name_or_path)
        config = _checkpoint_config(name, local_only)
        if config is None:
            return {}
        return {key: (config.get(key, defaults[key]),
                      f"model.name_or_path={name}'s config.json {key}") for key in SHAPE_KEYS}
    given = OmegaConf.select(model, "config", default=None) or {}
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
