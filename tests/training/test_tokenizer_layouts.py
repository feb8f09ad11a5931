"""Every tokenizer folder layout transformers reads is accepted by model.tokenizer (issue 60,
item 5): vocab.txt or tokenizer.json alone, either beside tokenizer_config.json and/or
special_tokens_map.json, and a saved model's folder. Each loads as BERT's tokenizer (its
special tokens, a pair's token types, the vocabulary's ids), and each lacking a special token
is refused in one line naming the file and the token. A tokenizer.json alone used to be
refused as lacking every role; a Google vocab.txt beside a tokenizer_config.json naming no
class did not load."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece
from transformers import AutoTokenizer, BertConfig, BertForMaskedLM, BertTokenizerFast

from bertkit.errors import BertkitError
from bertkit.training.models import GENERIC_TOKENIZER_CLASSES, JOB_TOKENS, load_tokenizer

# BertTokenizerFast's special tokens by role: what a folder naming no roles is read with.
BERT_TOKENS = {name: parameter.default for name, parameter
               in inspect.signature(BertTokenizerFast.__init__).parameters.items()
               if name in JOB_TOKENS["pretraining"]}
WORDS = [f"word{i}" for i in range(20)]
# The special tokens last, in another order than BERT's: an id right by chance is unlikely.
VOCABULARY = [*WORDS, *reversed(BERT_TOKENS.values())]
TINY_MODEL = {"hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
              "intermediate_size": 16, "max_position_embeddings": 32}


def vocab_txt(folder: Path, tokens: list[str]) -> str:
    (folder / "vocab.txt").write_text("".join(f"{token}\n" for token in tokens))
    return "vocab.txt"


def tokenizer_json(folder: Path, tokens: list[str]) -> str:
    """The `tokenizers` library's own file, as a user builds it: WordPiece, BERT's normalizer
    and post-processor, the special tokens as added tokens; no transformers file beside it."""
    ids = {token: index for index, token in enumerate(tokens)}
    tokenizer = Tokenizer(WordPiece(ids, unk_token=BERT_TOKENS["unk_token"]))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    sep, cls = BERT_TOKENS["sep_token"], BERT_TOKENS["cls_token"]
    tokenizer.post_processor = processors.BertProcessing((sep, ids.get(sep, 0)),
                                                         (cls, ids.get(cls, 0)))
    tokenizer.add_special_tokens([token for token in BERT_TOKENS.values() if token in ids])
    tokenizer.save(str(folder / "tokenizer.json"))
    return "tokenizer.json"


VOCABULARY_FILES = {"vocab.txt": vocab_txt, "tokenizer.json": tokenizer_json}
# tokenizer_config.json as found: Google's (no class), transformers' BertTokenizer, and one
# per generic class (what PreTrainedTokenizerFast(tokenizer_object=...) saves).
TOKENIZER_CONFIGS = {
    "google": {"do_lower_case": True},
    "BertTokenizer": {"tokenizer_class": "BertTokenizer", "do_lower_case": True,
                      **BERT_TOKENS},
    **{name: {"tokenizer_class": name, **BERT_TOKENS} for name in GENERIC_TOKENIZER_CLASSES},
}
SETTINGS = {
    "alone": {},
    **{f"tokenizer_config.json({name})": {"tokenizer_config.json": settings}
       for name, settings in TOKENIZER_CONFIGS.items()},
    "special_tokens_map.json": {"special_tokens_map.json": BERT_TOKENS},
    "both": {"tokenizer_config.json": TOKENIZER_CONFIGS["google"],
             "special_tokens_map.json": BERT_TOKENS},
}


def file_layout(vocabulary_file: str, settings: dict):
    def build(folder: Path, tokens: list[str]) -> str:
        named = VOCABULARY_FILES[vocabulary_file](folder, tokens)
        for file_name, content in settings.items():
            (folder / file_name).write_text(json.dumps(content))
        return named
    return build


def saved_model(load_source):
    """A model's folder as save_pretrained writes it: a tiny BERT and the tokenizer that
    `load_source` reads from a folder of the user's files, saved beside it."""
    def build(folder: Path, tokens: list[str]) -> str:
        source = folder / "source"
        source.mkdir()
        tokenizer = load_source(source, tokens)
        BertForMaskedLM(BertConfig(vocab_size=len(tokens) + 1, **TINY_MODEL)
                        ).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        return "tokenizer.json"
    return build


def _bert_from_vocab_txt(folder: Path, tokens: list[str]):
    return BertTokenizerFast(str(folder / vocab_txt(folder, tokens)))


def _auto_from_tokenizer_json(folder: Path, tokens: list[str]):
    tokenizer_json(folder, tokens)
    return AutoTokenizer.from_pretrained(str(folder))


LAYOUTS = {
    **{f"{vocabulary} {name}": file_layout(vocabulary, settings)
       for vocabulary in VOCABULARY_FILES for name, settings in SETTINGS.items()},
    "saved model (BertTokenizerFast)": saved_model(_bert_from_vocab_txt),
    "saved model (AutoTokenizer of a tokenizer.json)": saved_model(_auto_from_tokenizer_json),
}


def tokenizer_node(folder: Path):
    return OmegaConf.create({"tokenizer": str(folder), "name_or_path": None,
                             "do_lower_case": True, "trust_remote_code": False, "config": {}})


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_loads_as_bert_with_the_vocabulary_ids(layout, tmp_path):
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    LAYOUTS[layout](folder, VOCABULARY)
    tokenizer = load_tokenizer(tokenizer_node(folder), job="pretraining")
    ids = {token: index for index, token in enumerate(VOCABULARY)}
    for role, token in BERT_TOKENS.items():
        assert getattr(tokenizer, role) == token, role
        assert getattr(tokenizer, f"{role}_id") == ids[token], role
    encoded = tokenizer("Word3 unseen", "word7")
    assert encoded["input_ids"] == [ids["[CLS]"], ids["word3"], ids["[UNK]"], ids["[SEP]"],
                                    ids["word7"], ids["[SEP]"]]
    assert encoded["token_type_ids"] == [0, 0, 0, 0, 1, 1]
    assert len(tokenizer) == len(VOCABULARY)  # no token added beside the vocabulary


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("role", JOB_TOKENS["pretraining"])
def test_every_layout_lacking_a_special_token_is_refused_naming_file_and_token(
        layout, role, tmp_path):
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    token = BERT_TOKENS[role]
    named = LAYOUTS[layout](folder, [item for item in VOCABULARY if item != token])
    with pytest.raises(BertkitError) as error:
        load_tokenizer(tokenizer_node(folder), job="pretraining")
    assert str(error.value) == (f"model.tokenizer={folder}: {folder / named} lacks the special "
                                f"token {token} ({role}) that pretraining feeds the model; add "
                                f"it to the vocabulary")
