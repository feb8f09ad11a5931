"""The model's own rules, checked against the run's other settings before data or models load
(issue 48, settings checked against each other): each broken one is one line naming both keys.

The cases are not listed by hand: every integer key a model preset's `config` sets (and
vocab_size, BertConfig's) is swept over small values, and transformers and torch are the
oracle, a tiny BertModel built and run on the run's inputs (its length, a second segment or
none, the tokenizer's largest id). The check must refuse exactly what the library rejects,
so that the rules cannot drift from it; and no model preset is refused with any task or
objective."""

from __future__ import annotations

import functools
import random
import re
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from transformers import BertConfig, BertModel

from bertkit.config_schema import check_ranges
from bertkit.config_tree import config_dir
from bertkit.errors import BertkitError
from bertkit.jobs import run_job
from bertkit.pretraining.objective import objective_named, registered
from bertkit.pretraining.run import check_pretraining_config
from bertkit.tasks import task_family
from bertkit.training.finetune import check_model_for_task
from bertkit.training.models import SHAPE_KEYS, check_model_settings, load_tokenizer
from tests.conftest import compose_config, tiny_run_overrides
from tests.finetuning.test_every_family import family_run  # noqa: F401
from tests.tasks.ner.test_ner_recipe import conll_files  # noqa: F401
from tests.tasks.squad.test_squad_recipe import squad_files  # noqa: F401
from tests.tasks.swag.test_swag_recipe import swag_files  # noqa: F401

MODEL_DIR = Path(config_dir()) / "model"
MODEL_PRESETS = sorted(path.stem for path in MODEL_DIR.glob("*.yaml"))
TASKS = sorted(path.stem for path in (Path(config_dir()) / "task").glob("*.yaml"))
FAMILIES = ("glue", "squad", "swag", "ner")


def model_config_keys() -> list[str]:
    """The integer sizes a preset's model.config sets, and vocab_size (the tokenizer's size
    unless model.config gives it): the keys a user may contradict the run with."""
    keys = {key for path in MODEL_DIR.glob("*.yaml")
            for key, value in (OmegaConf.load(path).get("config") or {}).items()
            if isinstance(value, int) and not isinstance(value, bool)}
    keys.add("vocab_size")
    return sorted(key for key in keys if hasattr(BertConfig(), key))


# A tiny model and run the sweep varies one key of: 12 tokens long, a 20-token vocabulary.
TINY = {"hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 16, "max_position_embeddings": 16, "type_vocab_size": 2,
        "vocab_size": 20}
LENGTH, TOKENS = 12, 20
PAIR = "task.columns.text_b=sentence2"


def candidates(base: int) -> list[int]:
    """Values around every boundary a size may meet: small ones, the run's length and the
    tokenizer's size, and the tiny model's own value."""
    return sorted({value for edge in (1, 2, LENGTH, TOKENS, base)
                   for value in (edge - 1, edge, edge + 1) if value >= 1})


@functools.cache
def library_rejects(sizes: tuple, pair: bool) -> bool:
    """The oracle: transformers builds the model and torch runs it on one sequence of LENGTH
    tokens holding the tokenizer's largest id, its second half in segment B for a pair: the
    embedding lookups raise IndexError where a table is too short."""
    try:
        model = BertModel(BertConfig(**dict(sizes)))
        ids = torch.arange(LENGTH) % TOKENS
        ids[-1] = TOKENS - 1
        types = torch.zeros(LENGTH, dtype=torch.long)
        if pair:
            types[LENGTH // 2:] = 1
        with torch.no_grad():
            # Positions given as the lookups the model makes (its own buffer would broadcast
            # a single position over the sequence, a wrong model rather than an error).
            model(input_ids=ids[None], token_type_ids=types[None],
                  position_ids=torch.arange(LENGTH)[None])
    except Exception:  # noqa: BLE001  (whatever the library raises is a rejection)
        return True
    return False


def our_refusal(sizes: dict, pair: bool, checkpoint: Path | None) -> str | None:
    """check_model_settings' message for these sizes, given in model.config or in a
    checkpoint's config.json; None when it lets them pass."""
    if checkpoint is None:
        model = {"name_or_path": None, "tokenizer": None, "trust_remote_code": False,
                 "config": sizes}
    else:
        BertConfig(**sizes).save_pretrained(checkpoint)
        model = {"name_or_path": str(checkpoint), "tokenizer": None,
                 "trust_remote_code": False, "config": {}}
    try:
        check_model_settings(OmegaConf.create(model), {"task.max_seq_length": LENGTH},
                             PAIR if pair else None, TOKENS)
    except BertkitError as error:
        return str(error)
    return None


@pytest.mark.parametrize("source", ["model.config", "checkpoint"])
def test_the_check_refuses_exactly_what_the_library_rejects(source, tmp_path):
    rejected_keys = set()
    for key in model_config_keys():
        for value in candidates(TINY.get(key, 8)):
            sizes = {**TINY, key: value}
            for pair in (False, True):
                rejects = library_rejects(tuple(sorted(sizes.items())), pair)
                message = our_refusal(sizes, pair, tmp_path / "checkpoint"
                                      if source == "checkpoint" else None)
                case = f"{key}={value}, {'a pair' if pair else 'one segment'}"
                assert (message is not None) == rejects, (case, message)
                if message is None:
                    continue
                rejected_keys.add(key)
                assert "\n" not in message, message
                # The key with its value (the positions' message: "the 8 positions of
                # model.config.max_position_embeddings", as before), and the other key.
                named = (f"model.config.{key}" if source == "model.config"
                         else f"model.name_or_path={tmp_path / 'checkpoint'}'s config.json {key}")
                other = {"hidden_size": "num_attention_heads", "num_attention_heads":
                         "hidden_size", "type_vocab_size": PAIR, "vocab_size":
                         "model.tokenizer=", "max_position_embeddings":
                         f"task.max_seq_length={LENGTH}"}[key]
                assert named in message and re.search(rf"\b{value}\b", message), (case, message)
                assert other in message, (case, message)
    # Every rule is one the library holds, and every key the library rejects has a rule.
    assert rejected_keys == set(SHAPE_KEYS)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_task_that_feeds_a_second_segment_needs_two_token_types(
        family, family_run, tmp_path):  # noqa: F811
    """The issue's IndexError at step 0 (model.config.type_vocab_size=1 on a sentence-pair
    task), one line before any data is read; the oracle is the family's own features, whose
    token types the model's table must hold."""
    cfg = family_run(family, {"model.config.type_vocab_size": 1,
                              "cache_dir": tmp_path / "cache"})
    spec = task_family(family)
    feeds_two = spec.second_segment(cfg.task, cfg.data_source) is not None
    if feeds_two:
        with pytest.raises(BertkitError) as error:
            run_job(cfg, run_dir=tmp_path / "run")
        message = str(error.value)
        segment = spec.second_segment(cfg.task, cfg.data_source)
        assert message.startswith("model.config.type_vocab_size=1 is below the 2 token types "
                                  f"of {segment}") and "\n" not in message
        assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()
    spec.generate_data(cfg.task)
    features = spec.featurize(cfg.task, spec.read(cfg.task, cfg.data_source),
                              load_tokenizer(cfg.model), cfg.cache_dir,
                              cfg.preprocessing_num_workers).features["train"]
    types = max(flat(features["token_type_ids"])) + 1
    assert (types > 1) == feeds_two, (family, types)
    if not feeds_two:  # one segment: a table of one type is enough
        check_model_for_task(cfg.task, cfg.model, cfg.data_source, spec, None)


def flat(values) -> list[int]:
    """The ids of a column, however nested (SWAG's rows hold one sequence per choice)."""
    return [leaf for value in values
            for leaf in (flat(value) if isinstance(value, list) else [value])]


def tiny_documents(count: int = 12) -> list[list[list[int]]]:
    """Documents of sentences of token ids (ids above the special tokens' 0-4)."""
    rng = random.Random(0)
    return [[[rng.randint(5, 99) for _ in range(rng.randint(3, 9))]
             for _ in range(rng.randint(3, 6))] for _ in range(count)]


@pytest.mark.parametrize("name", sorted(registered()))
def test_a_pretraining_objective_of_sentence_pairs_needs_two_token_types(name, tmp_path):
    """Asked of the objective, not of its name; its instances are the oracle."""
    objective = objective_named(name)
    rows = objective.buffer_rows(tiny_documents(), random.Random(0), max_seq_length=32,
                                 short_seq_prob=0.1, cls_id=2, sep_id=3)
    feeds_two = max(flat(rows["token_type_ids"])) > 0
    assert objective.second_segment == feeds_two
    cfg = compose_config(["recipe=pretrain", f"objective={name}", "logger=none",
                          "model.config.type_vocab_size=1"])
    if not feeds_two:
        check_pretraining_config(cfg)
        return
    with pytest.raises(BertkitError, match=rf"^model\.config\.type_vocab_size=1 is below the 2 "
                                           rf"token types of objective\.name={name} "):
        check_pretraining_config(cfg)


def test_the_issue_heads_that_do_not_divide_the_hidden_size(glue_dir, vocab_dir, tmp_path):
    """Was transformers' ValueError traceback from BertSelfAttention."""
    cfg = compose_config(tiny_run_overrides("rte", glue_dir("rte"), vocab_dir, **{
        "model.config.hidden_size": 128, "model.config.num_attention_heads": 3,
        "cache_dir": tmp_path / "cache"}))
    with pytest.raises(BertkitError, match=r"^model\.config\.hidden_size=128 is not a multiple "
                                           r"of model\.config\.num_attention_heads=3: [^\n]*$"):
        run_job(cfg, run_dir=tmp_path / "run")
    assert not (tmp_path / "cache").exists()


@pytest.mark.slow  # a run
def test_model_config_vocab_size_is_held_to_the_tokenizer_and_honoured(glue_dir, vocab_dir,
                                                                        tmp_path):
    """Below the tokenizer's ids: one line naming both keys, before data is read; at or
    above: the model gets that many embeddings (a size rounded up for tensor cores)."""
    tokens = len((vocab_dir / "vocab.txt").read_text().splitlines())
    small = compose_config(tiny_run_overrides("rte", glue_dir("rte"), vocab_dir, **{
        "+model.config.vocab_size": tokens - 1, "cache_dir": tmp_path / "cache"}))
    with pytest.raises(BertkitError, match=rf"^model\.config\.vocab_size={tokens - 1} is below "
                                           rf"the {tokens} tokens of model\.tokenizer="):
        run_job(small, run_dir=tmp_path / "small")
    assert not (tmp_path / "cache").exists()
    rounded = -(-tokens // 64) * 64 + 64
    run_job(compose_config(tiny_run_overrides("rte", glue_dir("rte"), vocab_dir, **{
        "+model.config.vocab_size": rounded})), run_dir=tmp_path / "run")
    saved = BertConfig.from_pretrained(tmp_path / "run" / "model")
    assert saved.vocab_size == rounded


@functools.cache
def family_of(task: str) -> str:
    return compose_config([f"task={task}"]).task.family


def composes_and_passes(overrides: list[str]) -> None:
    cfg = compose_config([*overrides, "logger=none"])
    if cfg.recipe.job == "pretrain":
        check_pretraining_config(cfg)
        return
    check_ranges(cfg)
    family = task_family(cfg.task.family)
    family.check(cfg.task, cfg.model)
    check_model_for_task(cfg.task, cfg.model, cfg.data_source, family, None)


@pytest.mark.slow  # 19 compositions a preset
@pytest.mark.parametrize("model", MODEL_PRESETS)
def test_every_model_preset_goes_with_every_task_and_objective(model):
    """No false refusals: each preset with each task of conf/task (in its family's recipe)
    and each pretraining objective passes the checks."""
    for task in TASKS:
        composes_and_passes([f"recipe={family_of(task)}", f"task={task}", f"model={model}"])
    for name in registered():
        composes_and_passes(["recipe=pretrain", f"objective={name}", f"model={model}"])


def test_pretraining_checks_its_downstream_tasks_before_it_starts(tmp_path):
    """A downstream GLUE finetune that the pretrained model cannot run is refused before the
    pretraining's hours, not after them."""
    base = ["recipe=pretrain", "objective=mlm", "logger=none", "pretraining.long_phase.fraction=0",
            "model.config.type_vocab_size=1", "model.config.max_position_embeddings=128"]
    check_pretraining_config(compose_config([*base, "downstream.tasks={cola: null}"]))
    with pytest.raises(BertkitError, match=r"^model\.config\.type_vocab_size=1 is below the 2 "
                                           r"token types of downstream\.tasks\.mrpc's task\."):
        check_pretraining_config(compose_config([*base, "downstream.tasks={cola: null, "
                                                        "mrpc: null}"]))
    with pytest.raises(BertkitError, match=r"^downstream\.tasks\.cola's task\.max_seq_length=200 "
                                           r"exceeds the 128 positions of model\.config\."):
        check_pretraining_config(compose_config([
            *base, "downstream.tasks={cola: ['task.max_seq_length=200']}"]))


def test_the_check_before_loading_never_goes_to_the_network(monkeypatch):
    """A Hub checkpoint not in the cache is checked once it loads (local_only): the check at
    the edge asks the Hub cache only, the custom-code guard on the way included. Online, each
    request of a user without network would otherwise retry for about 20 s."""
    import huggingface_hub.file_download

    def no_network(*args, **kwargs):
        raise AssertionError("the check before loading asked the Hub")

    monkeypatch.setattr(huggingface_hub.file_download, "get_hf_file_metadata", no_network)
    model = OmegaConf.create({"name_or_path": "bertkit-tests/not-in-the-cache",
                              "tokenizer": None, "trust_remote_code": False, "config": {}})
    check_model_settings(model, {"task.max_seq_length": 128}, None, None)
