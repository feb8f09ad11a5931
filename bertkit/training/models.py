"""Tokenizer and BERT model from a Hub id, a local checkpoint, or a config trained from scratch.
Each family adds its own head through load_with_head (bertkit/tasks/<family>/models.py)."""

from __future__ import annotations

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
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        **OmegaConf.to_container(model.config),
        **head,
        **dropout,
        **attention_setting(model),
    )
    return bert_class(config)


def check_sequence_length(model: DictConfig, max_seq_length: int, key: str) -> None:
    """A task longer than the model's position embeddings would fail inside the model (or,
    with the tokenizer's cap, be cut silently): one message instead, before features are
    built. The limit is the checkpoint's own, or model.config's for a model from scratch."""
    if model.name_or_path:
        try:
            limit = AutoConfig.from_pretrained(str(model.name_or_path)).max_position_embeddings
        except (OSError, ValueError) as err:
            raise hub_error("model", str(model.name_or_path), "model.name_or_path",
                            err) from None
        where = f"model.name_or_path={model.name_or_path}"
    else:
        limit = OmegaConf.select(model, "config.max_position_embeddings", default=512)
        where = "model.config.max_position_embeddings"
    if max_seq_length > limit:
        raise BertkitError(f"{key}={max_seq_length} exceeds the {limit} positions of {where}: "
                           f"lower {key} to at most {limit}")
