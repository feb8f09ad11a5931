"""A pretraining objective as one registry entry, as the finetuning methods are
(bertkit.finetuning.method): an Objective subclass in its own module of
bertkit/pretraining/objectives/, named in its OBJECTIVES table (bertkit.registry), and a preset
conf/objective/<name>.yaml that `objective=<name>` picks. The rest of pretraining asks the
objective what it does (its instances, its sentence task, the documents it needs) instead of
comparing its name.

The preset's keys stay what users override and runs record (objective.name,
objective.sentence_task, objective.packing); they are the class's, and a value the class does
not have is refused naming the key.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import datasets
from omegaconf import DictConfig
from transformers import PreTrainedTokenizerBase

from bertkit.errors import BertkitError
from bertkit.registry import imported

# The preset's keys besides name that say what the objective is (recorded in config.yaml).
DESCRIBED_BY = ("sentence_task", "packing")


class Objective:
    """What differs between pretraining objectives. Stateless: an instance per lookup."""

    name: str = ""  # its module's name, set by @register: objective.name and objective=<name>
    title: str = ""  # what it trains, in messages ("next sentence prediction")
    summary: str = ""  # what it trains on, for a message that suggests it instead
    # The sentence-level task trained beside MLM on BertForPreTraining's sentence head, or None
    # (MLM alone): its label is the next_sentence_label column, its scores are logged as
    # <sentence_task>_loss and <sentence_task>_accuracy (training and held out).
    sentence_task: str | None = None
    packing: str = ""  # how text becomes sequences (objective.packing)
    # Its instances put a second segment (token type 1) after the first, [CLS] A [SEP] B [SEP]:
    # the model then needs two token types (bertkit.training.models.check_model_settings).
    second_segment: bool = False
    # Documents the instances need (each side of the held-out split, each buffer of a
    # stream), why, and an objective that trains on fewer (suggested when a corpus is short).
    documents_needed: int = 1
    documents_reason: str = ""
    fewer_documents: str | None = None
    # With static masking's dupe_factor: each copy of the instances is cut anew (their cuts
    # are random), else the instances are cut once and the copies differ by their masks only.
    cuts_each_copy: bool = False

    def instances(self, tokenized: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, *,
                  max_seq_length: int, short_seq_prob: float, seed: int, copies: int = 1,
                  num_proc: int | None = None) -> datasets.Dataset:
        """The training instances of tokenised documents (a sentence_ids column): input_ids,
        token_type_ids and length, with next_sentence_label for a sentence task. A held-out
        sentence task is scored on these too, built from the held-out documents."""
        raise NotImplementedError

    def buffer_rows(self, documents: Sequence, rng: random.Random, *, max_seq_length: int,
                    short_seq_prob: float, cls_id: int, sep_id: int) -> dict:
        """The columns of one buffer's instances when the corpus is a stream: no random
        access to other documents than the buffer's (streaming_instances)."""
        raise NotImplementedError

    def check_stream(self, buffer_documents: int) -> None:
        """A buffer must hold the documents the instances need."""
        if buffer_documents < self.documents_needed:
            raise BertkitError(
                f"pretraining.streaming_buffer_documents={buffer_documents}: {self.title} needs "
                f"at least {self.documents_needed} documents in a buffer "
                f"({self.documents_reason})")


_REGISTRY: dict[str, type[Objective]] = {}


def register(cls: type[Objective]) -> type[Objective]:
    """Class decorator of an objective module: the class is its registry entry, by module
    name (the preset's name)."""
    name = cls.__module__.rsplit(".", 1)[-1]
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise BertkitError(f"objective {name} is registered twice "
                           f"({_REGISTRY[name].__qualname__} and {cls.__qualname__})")
    cls.name = name
    _REGISTRY[name] = cls
    return cls


def registered() -> dict[str, type[Objective]]:
    """name -> class of every objective of bertkit/pretraining/objectives/ (and of any other
    module that registered one, a test's), sorted by name."""
    from bertkit.pretraining.objectives import OBJECTIVES

    for entry in OBJECTIVES.values():
        imported(entry)  # its @register enters it
    return dict(sorted(_REGISTRY.items()))


def objective_named(name: str) -> Objective:
    """The registered objective of that name (objective.name)."""
    found = registered().get(name)
    if found is None:
        raise BertkitError(f"objective={name}: no objective of that name (objective.name); "
                           f"expected one of {', '.join(registered())}")
    return found()


def _shown(value) -> str:
    return "null" if value is None else str(value)


def objective_of(node: DictConfig) -> Objective:
    """The objective the config's `objective` node names, its other keys held to the class's
    (a preset's key overridden to another objective's value names that objective)."""
    objective = objective_named(node.name)
    for key in DESCRIBED_BY:
        own = getattr(objective, key)
        value = node[key]
        if value != own:
            others = [name for name, cls in registered().items() if getattr(cls, key) == value]
            advice = f"objective={others[0]} has it" if others else "no objective has it"
            raise BertkitError(f"objective.{key}={_shown(value)}: objective={objective.name}'s "
                               f"is {_shown(own)} (conf/objective/{objective.name}.yaml); "
                               f"{advice}")
    return objective


class _Values:
    """One key's values over the registered objectives, read when iterated (the schema's
    choices: config_schema resolves "module:NAME" when it checks a value)."""

    def __init__(self, key: str):
        self.key = key

    def __iter__(self):
        values = (getattr(cls, self.key) for cls in registered().values())
        return iter(dict.fromkeys(value for value in values if value is not None))


NAMES, SENTENCE_TASKS, PACKINGS = _Values("name"), _Values("sentence_task"), _Values("packing")
