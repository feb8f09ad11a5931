"""Train a BERT WordPiece vocabulary on a corpus, so pretraining from scratch needs no Hub vocab.

The pipeline is BertWordPieceTokenizer's (the tokenizers library's setup for BERT): BERT's
normaliser and pre-tokeniser, WordPiece with "##" continuations, [CLS] A [SEP] B [SEP] pairs.
Training streams the texts (train_from_iterator), so a large corpus is never held in memory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors, trainers
from tokenizers.models import WordPiece
from transformers import BertTokenizerFast, PreTrainedTokenizerFast

from bertkit.data.atomic_files import DamagedFile, discard_damaged, read_json, read_text
from bertkit.errors import BertkitError
from bertkit.training.models import from_pretrained

# The order fixes the ids: [PAD] is 0, as BERT's embeddings and collators expect.
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
CONTINUING_PREFIX = "##"


def _untrained_tokenizer(lowercase: bool) -> Tokenizer:
    tokenizer = Tokenizer(WordPiece(unk_token="[UNK]", continuing_subword_prefix=CONTINUING_PREFIX))
    # strip_accents=None follows lowercase, as in the original BERT.
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix=CONTINUING_PREFIX)
    return tokenizer


def _add_pair_template(tokenizer: Tokenizer) -> None:
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )


def _write_vocab_txt(tokenizer: PreTrainedTokenizerFast, directory: Path) -> None:
    """transformers 5 saves only tokenizer.json; vocab.txt keeps Google's tools able to read it."""
    vocab = tokenizer.backend_tokenizer.get_vocab(with_added_tokens=False)
    tokens = sorted(vocab, key=vocab.__getitem__)
    (directory / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")


def _publish(staging: Path, output_dir: Path) -> None:
    """Swap the finished directory in with renames, so readers never see a half-written one."""
    if not output_dir.exists():
        os.replace(staging, output_dir)
        return
    retired = Path(tempfile.mkdtemp(dir=output_dir.parent, prefix=f".{output_dir.name}.old-"))
    os.replace(output_dir, retired / output_dir.name)
    os.replace(staging, output_dir)
    shutil.rmtree(retired, ignore_errors=True)


def train_wordpiece(texts: Iterable[str], output_dir: Path, *, vocab_size: int,
                    min_frequency: int, lowercase: bool,
                    limit_alphabet: int = 1000) -> PreTrainedTokenizerFast:
    """Train, save to output_dir (tokenizer.json, tokenizer_config.json, vocab.txt), return it."""
    if vocab_size <= len(SPECIAL_TOKENS):
        raise BertkitError(f"tokenizer_training.vocab_size={vocab_size}: must exceed the "
                           f"{len(SPECIAL_TOKENS)} special tokens {' '.join(SPECIAL_TOKENS)}")
    backend = _untrained_tokenizer(lowercase)
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        limit_alphabet=limit_alphabet,
        continuing_subword_prefix=CONTINUING_PREFIX,
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    _add_pair_template(backend)
    tokenizer = BertTokenizerFast(
        tokenizer_object=backend,
        do_lower_case=lowercase,
        model_max_length=512,
        pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]",
    )
    output_dir = Path(output_dir)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=output_dir.parent, prefix=f".{output_dir.name}.",
                                    suffix=".tmp"))
    try:
        tokenizer.save_pretrained(str(staging))
        _write_vocab_txt(tokenizer, staging)
        _publish(staging, output_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return tokenizer


def trained_tokenizer_dir(cache_dir: str | Path, corpus_fingerprint: str, *, vocab_size: int,
                          min_frequency: int, lowercase: bool,
                          limit_alphabet: int = 1000) -> Path:
    """One directory per corpus and training settings, so a repeated run reuses the vocab."""
    settings = {"corpus": corpus_fingerprint, "vocab_size": vocab_size,
                "min_frequency": min_frequency, "lowercase": lowercase,
                "limit_alphabet": limit_alphabet}
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    return Path(cache_dir) / "wordpiece" / f"{key}-v{vocab_size}"


def ensure_trained_tokenizer(texts_factory: Callable[[], Iterable[str]], directory: Path,
                             **settings) -> PreTrainedTokenizerFast:
    """Load the vocab trained earlier into directory; train it (reading the corpus) only if none,
    or if the one there is cut or corrupt (checked first: a cut tokenizer.json would otherwise
    be a tokenizers traceback, a cut vocab.txt a shorter vocabulary)."""
    directory = Path(directory)
    if directory.exists():
        discard_damaged([directory], lambda: check_trained_tokenizer(directory),
                        "trained vocabulary")
    if (directory / "tokenizer.json").is_file():
        return from_pretrained(BertTokenizerFast, str(directory), "trained vocabulary",
                               "tokenizer", trust_remote_code=False)
    return train_wordpiece(texts_factory(), directory, **settings)


def check_trained_tokenizer(directory: Path) -> None:
    """What train_wordpiece saves: two JSON files, and vocab.txt with one line per token of
    tokenizer.json's vocabulary."""
    model = read_json(directory / "tokenizer.json").get("model")
    read_json(directory / "tokenizer_config.json")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    lines = read_text(directory / "vocab.txt").split("\n")
    if not isinstance(vocab, dict) or lines[-1] != "" or len(lines) - 1 != len(vocab):
        raise DamagedFile(f"{directory / 'vocab.txt'}: cut or corrupt: {len(lines) - 1} lines "
                          f"for the {len(vocab) if isinstance(vocab, dict) else '?'} tokens of "
                          f"tokenizer.json")
