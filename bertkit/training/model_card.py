"""The Hub model card (README.md) of every saved model directory: its metadata and
results, the usage snippet, and where the model and its data came from with no path of the
training machine in it.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml
from huggingface_hub import EvalResult, ModelCard, ModelCardData, metadata_load
from huggingface_hub.utils import HFValidationError, validate_repo_id
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from bertkit.data.atomic_files import write_text_atomic
from bertkit.data.metrics_file import LIMITED_SAMPLES, describe_cut, limited_samples
from bertkit.secret_masking import mask_secrets, mask_text

# ================================================================================================
# What a model card may say about where a model and its data came from: the base model of a
# local checkpoint (a Hub id, found in the checkpoint itself), and every path made portable, so
# that a card names no directory of the machine that trained the model (its home, its cache, a
# temporary directory).

CARD_FILE = "README.md"
CONFIG_FILE = "config.json"

# An absolute path inside a longer text (a command's `task.data_dir=/x/y`, a list of paths):
# `/` or `~/` at the start or after a space, `=`, a bracket, a comma or a quote (not after `:`
# or a word character, so URLs and ratios like 1/2 stay), up to the next such separator.
_EMBEDDED_PATH = re.compile(r"(?<![^\s=\[({,'\"`])~?/[^\s,'\"\])}|`]+")


def is_repo_id(name: str) -> bool:
    """A valid Hub repository id (`name` or `owner/name`), whether or not it exists."""
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def hub_id(name: str | None) -> str | None:
    """`name` when it names something on the Hub (base_model, datasets must): not a local
    path, and a valid repository id."""
    if not name or Path(name).expanduser().exists() or not is_repo_id(name):
        return None
    return name


def portable_path(path: str) -> str:
    """An absolute path relative to the working directory when it lies inside it, else its
    last component (a directory's name)."""
    resolved = Path(os.path.expanduser(path))
    cwd = Path.cwd()
    if cwd != Path(cwd.anchor) and resolved != cwd and resolved.is_relative_to(cwd):
        return resolved.relative_to(cwd).as_posix()
    return resolved.name or path


def without_absolute_paths(value):
    """`value` (a string, or lists and dicts of them) with every absolute path made portable;
    anything else as it is."""
    if isinstance(value, str):
        if os.path.isabs(os.path.expanduser(value)):
            return portable_path(value)
        return _EMBEDDED_PATH.sub(lambda match: portable_path(match.group()), value)
    if isinstance(value, dict):
        return {key: without_absolute_paths(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(without_absolute_paths(item) for item in value)
    return value


def model_reference(name: str) -> str:
    """How a card names a model: its Hub id, or a local checkpoint's portable path."""
    return name if hub_id(name) else without_absolute_paths(name)


def _hub_ids(value) -> str | list[str] | None:
    values = [value] if isinstance(value, str) else list(value or [])
    found = [item for item in values if isinstance(item, str) and hub_id(item)]
    if not found:
        return None
    return found[0] if isinstance(value, str) or len(found) == 1 else found


def checkpoint_base_model(name: str | None) -> str | list[str] | None:
    """The Hub model a local checkpoint directory comes from: `base_model` in its own card
    (README.md metadata, as the Hub and bertkit write it), else `_name_or_path` in its
    config.json when that is a Hub id (what it was loaded from before it was saved; the
    extracted MiniLM says nreimers/MiniLM-L6-H384-uncased). None: not a directory, or nothing
    names a Hub model."""
    if not name:
        return None
    directory = Path(name).expanduser()
    if not directory.is_dir():
        return None
    if (directory / CARD_FILE).is_file():
        try:
            metadata = metadata_load(directory / CARD_FILE) or {}
        except (ValueError, UnicodeDecodeError, yaml.YAMLError):  # a README.md but no card
            metadata = {}
        found = _hub_ids(metadata.get("base_model"))
        if found:
            return found
    config = directory / CONFIG_FILE
    if config.is_file():
        try:
            name_or_path = json.loads(config.read_text(encoding="utf-8")).get("_name_or_path")
        except (ValueError, UnicodeDecodeError, AttributeError):
            return None
        return _hub_ids(name_or_path)
    return None


# ================================================================================================
# The model card's usage section: a few lines of transformers that load the model and run it,
# with the pipeline of its family where transformers has one (SWAG's multiple choice never had
# one, and transformers 5 removed question-answering: the Auto model class then).

# How a card names a model that is not on the Hub: its directory, wherever it is copied to.
LOCAL_PLACEHOLDER = "path/to/model"

_PIPELINE = '''from transformers import pipeline

{name} = pipeline("{task}", model="{model}"{extra})
{call}'''

_MULTIPLE_CHOICE = '''import torch
from transformers import AutoModelForMultipleChoice, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("{model}")
model = AutoModelForMultipleChoice.from_pretrained("{model}")
context = "A man sits down at the piano."
endings = ["He starts to play a song.", "He eats the piano.", "He swims across the room.",
           "He paints the sky."]
# One [CLS] context [SEP] ending [SEP] sequence per choice, in a batch of one question.
inputs = tokenizer([context] * len(endings), endings, padding=True, return_tensors="pt")
with torch.no_grad():
    logits = model(**{{key: value.unsqueeze(0) for key, value in inputs.items()}}).logits
print(endings[logits.argmax(-1).item()])'''

_QUESTION_ANSWERING = '''import torch
from transformers import AutoModelForQuestionAnswering, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("{model}")
model = AutoModelForQuestionAnswering.from_pretrained("{model}")
question, context = "Where did the cat sit?", "The cat sat on the mat."
inputs = tokenizer(question, context, return_tensors="pt")
with torch.no_grad():
    output = model(**inputs)
# The best span of the context: its best start, then the best end from there.
outside = torch.tensor([segment != 1 for segment in inputs.sequence_ids()])
start = output.start_logits[0].masked_fill(outside, -1e9).argmax().item()
end = start + output.end_logits[0, start:].masked_fill(outside[start:], -1e9).argmax().item()
print(tokenizer.decode(inputs["input_ids"][0, start:end + 1]))'''

_FEATURE_BASED = (
    "{imports}from bertkit.tasks.ner.feature_based_tagger import load_feature_based_tagger\n\n"
    "# A frozen BERT with bertkit's tagger on its layers' features: no transformers pipeline.\n"
    "model, labels = load_feature_based_tagger({directory})")


def _classification_call(pair: bool, regression: bool) -> str:
    text = ('{"text": "The cat sat on the mat.", "text_pair": "A cat was sitting on the mat."}'
            if pair else '"The film was a delight from start to end."')
    what = "a sentence pair" if pair else "a sentence"
    note = ("score: the predicted value (a regression head)" if regression
            else "label: one of the model's class names")
    return f"# {what}; {note}\nprint(classifier({text}))"


def usage_code(family: str, model: str, *, on_hub: bool = False, pair: bool = False,
               regression: bool = False, feature_based: bool = False) -> str | None:
    """Python that loads `model` (a Hub id, on_hub, or a path) and runs it; None for an
    unknown family."""
    if family == "glue":
        return _PIPELINE.format(name="classifier", task="text-classification", model=model,
                                extra="", call=_classification_call(pair, regression))
    if family == "squad":
        return _QUESTION_ANSWERING.format(model=model)
    if family == "ner":
        if feature_based:  # bertkit's loader reads a directory: a Hub model's local copy
            return _FEATURE_BASED.format(
                imports="from huggingface_hub import snapshot_download\n" if on_hub else "",
                directory=f'snapshot_download("{model}")' if on_hub else f'"{model}"')
        return _PIPELINE.format(name="tagger", task="token-classification", model=model,
                                extra=', aggregation_strategy="simple"',
                                call='print(tagger("Angela Merkel visited Paris in May."))')
    if family == "swag":
        return _MULTIPLE_CHOICE.format(model=model)
    if family == "pretraining":
        return _PIPELINE.format(name="fill", task="fill-mask", model=model, extra="",
                                call='print(fill("The capital of France is [MASK]."))')
    return None


def usage_section(family: str, hub_model_id: str | None, **kinds) -> str | None:
    """The card's `## Usage` section: the model by its Hub id when it is pushed, else by
    LOCAL_PLACEHOLDER."""
    model = hub_model_id or LOCAL_PLACEHOLDER
    code = usage_code(family, model, on_hub=bool(hub_model_id), **kinds)
    if code is None:
        return None
    where = ("" if hub_model_id else
             f"`{LOCAL_PLACEHOLDER}`: this directory (`<run dir>/model`), or its Hub id once "
             f"uploaded.\n\n")
    return f"## Usage\n\n{where}```python\n{code}\n```\n"


# ================================================================================================
# The Hub model card (README.md) of every saved model directory, and the Hub push that
# carries it.
#
# training.run.publish writes <run dir>/model/README.md right after metrics.json, from the
# same record, so that a model directory copied or uploaded anywhere says what it is: YAML
# metadata in the Hub's format (model-index with the dev scores, license, base model, tags) and
# a body with the results, a usage snippet, the command, the seed and the hyperparameters. No
# absolute path of the training machine appears in it (the provenance above). Settings: the
# model_card node of conf/config.yaml.
#
# With trainer.push_to_hub=true the model goes up through Trainer's own push_to_hub, once, at
# the end of the run (training.run.push_if_asked), with this card as its README.md
# (BertkitTrainer, bertkit.training.trainer).

# task.family -> the Hub's task id (model-index, pipeline_tag) and its name.
TASK_TYPES = {
    "glue": ("text-classification", "Text Classification"),
    "squad": ("question-answering", "Question Answering"),
    "swag": ("multiple-choice", "Multiple Choice"),
    "ner": ("token-classification", "Token Classification"),
    "pretraining": ("fill-mask", "Fill-Mask"),
}


@dataclass(frozen=True)
class CardDataset:
    """The dataset of the model-index: `type` the Hub dataset the config names (on_hub), else
    the task's or corpus's name (generated or local data)."""

    type: str
    name: str
    config: str | None = None
    on_hub: bool = False

    @classmethod
    def of(cls, node: DictConfig) -> CardDataset:
        """From a task or corpus config: its hub.path and hub.name, where it has them."""
        path = OmegaConf.select(node, "hub.path")  # a task or corpus without hub node: None
        config = OmegaConf.select(node, "hub.name")
        return cls(type=path or node.name, name=node.name, config=config,
                   on_hub=path is not None)


@dataclass
class CardFacts:
    """What a card says about one model, whatever made it."""

    model_name: str
    family: str
    summary: str  # the body's first paragraph
    started_from: str | None  # a Hub id or a local path; None: random initialisation
    dataset: CardDataset
    results: dict[str, dict[str, float]]  # split -> metric -> value: the model-index
    results_note: str
    hyperparameters: dict
    seed: int
    # The body's results table, where it shows more than the model-index (a cut split's
    # scores, bertkit.data.metrics_file); None: the model-index's.
    shown_results: dict[str, dict[str, float]] | None = None
    training: dict = field(default_factory=dict)  # steps, loss, ...: the body's facts
    sections: list[str] = field(default_factory=list)  # further Markdown sections
    usage: str | None = None  # the `## Usage` section (usage_section)


def command_line() -> str | None:
    """`bertkit <overrides>` of the running Hydra job (a sweep's job: its own values); None
    outside one (finetune or pretrain called from Python)."""
    if not HydraConfig.initialized():
        return None
    overrides = mask_secrets(list(HydraConfig.get().overrides.task))
    return " ".join(["bertkit", *(shlex.quote(o) for o in overrides)])


def _is_score(value) -> bool:
    """Scores are finite floats; integers in the results are counts (examples, entities)."""
    return isinstance(value, float) and math.isfinite(value)


def _scores(splits: dict) -> dict[str, dict[str, float]]:
    return {split: {metric: value for metric, value in scores.items() if _is_score(value)}
            for split, scores in splits.items() if isinstance(scores, dict)}


def heldout_scores(final: dict) -> dict[str, float]:
    """A pretraining held-out evaluation's scores (mlm_loss, nsp_accuracy, ...), without its
    step, tokens seen and time."""
    return {key: value for key, value in final.items()
            if key.endswith(("_loss", "_accuracy")) and _is_score(value)}


def _model_name(trainer: DictConfig, unnamed: str) -> str:
    """The last part of trainer.hub_model_id, else `unnamed`."""
    hub_model_id = trainer.hub_model_id
    return hub_model_id.split("/")[-1] if hub_model_id else unnamed


def _pushed_id(trainer: DictConfig) -> str | None:
    """The model's Hub id when the run pushes it (trainer.push_to_hub)."""
    return trainer.hub_model_id if trainer.push_to_hub else None


def _usage(cfg: DictConfig, family: str) -> str | None:
    """The card's usage section; the keys it reads are a family's own (a GLUE task's second
    column, its labels; NER's feature-based tagger): absent in the other families' nodes."""
    task = cfg.task if family != "pretraining" else None
    return usage_section(
        family, _pushed_id(cfg.trainer),
        pair=bool(OmegaConf.select(task, "columns.text_b")) if task else False,
        regression=family == "glue" and OmegaConf.select(task, "labels") is None,
        feature_based=bool(OmegaConf.select(cfg.model, "feature_based.enabled")))


# A finetune's training facts in its card: metrics.json's train key -> the card's name.
FINETUNE_TRAINING_FACTS = {"steps": "steps", "planned_steps": "planned_steps",
                           "complete": "complete", "loss": "mean training loss (every step)",
                           "training_seconds": "training_seconds"}


def partial_data_note(limited: dict[str, dict], what: str) -> str:
    """The card's words for a run on part of the data: each cut part (its first N of M and the
    setting that cut it), and that its scores are no result on `what`."""
    parts = "".join(f"\n- {describe_cut(part, entry)}" for part, entry in limited.items())
    return (f"\n\n**Partial data: not a result on {what}.** This run read only part of its "
            f"data, so no score below is given as a result in the model-index metadata; what "
            f"was cut:"
            f"{parts}")


def finetune_facts(cfg: DictConfig, record: dict) -> CardFacts:
    """A finetune's card from its metrics.json record (bertkit.data.metrics_file). A run on
    part of its data (details.limited_samples) gives no model-index result: a cut dev split's
    score is not the task's, nor is a full split's score of a model trained on part of the
    training data; the body shows the scores and says what was cut."""
    family, task = record["family"], cfg.task
    started = None if record["model"] == "from_scratch" else record["model"]
    origin = f"from {model_reference(started)}" if started else "from random initialisation"
    train = record.get("train", {})
    limited = limited_samples(record)
    scores = _scores({**record["validation"], **record.get("test", {})})
    return CardFacts(
        model_name=_model_name(cfg.trainer, f"bertkit-{task.name}"), family=family,
        summary=(f"BERT finetuned on {task.name} ({family} family, "
                 f"{TASK_TYPES[family][0]}) with bertkit, {origin}."),
        started_from=started, dataset=CardDataset.of(task),
        results={} if limited else scores, shown_results=scores,
        results_note=(f"The final model on the dev split(s)"
                      f"{' and the labelled test split(s)' if record.get('test') else ''}, as in "
                      f"the run's metrics.json; main metric: {record['main_metric']}."
                      + (partial_data_note(limited, task.name) if limited else "")),
        hyperparameters=record.get("hyperparameters", {}), seed=record["seed"],
        # metrics.json's train.loss is Trainer's train_loss: the mean over every step, not the
        # last step's, and the card says so.
        training={FINETUNE_TRAINING_FACTS[key]: train[key] for key in FINETUNE_TRAINING_FACTS
                  if key in train},
        usage=_usage(cfg, family))


def pretraining_facts(cfg: DictConfig, record: dict) -> CardFacts:
    """A pretraining run's card: the held-out set's final scores are its dev values."""
    corpus = cfg.corpus
    heldout = record.get("heldout") or {}
    final = heldout.get("final") or {}
    results = {}
    note = ("No held-out set (heldout.fraction=0): the training log's last scores below."
            if not heldout else "The held-out set was never scored: the training log's last "
            "scores below.")
    shown = None
    limited = limited_samples(record)
    if final:
        results = {"heldout": heldout_scores(final)}
        note = (f"Held-out masked positions (heldout.fraction={heldout['fraction']} of the "
                f"corpus's documents, never trained on): {heldout['sequences']} sequences, "
                f"{heldout['masked_positions']} masked positions, at step {final['step']}.")
    if limited:  # held out of a cut corpus: no result on the corpus
        shown, results = results, {}
        note += partial_data_note(limited, corpus.name)
    last = record.get("last_log") or {}
    train = record.get("train", {})
    sections = []
    downstream = record.get("downstream") or {}
    if downstream:
        rows = [(task, result["main_metric"], f"{result['main_value']:.4f}"
                 + (" (partial data: " + "; ".join(
                     describe_cut(part, entry)
                     for part, entry in result[LIMITED_SAMPLES].items()) + ")"
                    if result.get(LIMITED_SAMPLES) else ""))
                for task, result in downstream.items()]
        sections.append("## Downstream finetunes\n\nGLUE finetunes of this checkpoint in the "
                        "same job (each its own model, with its own card, in "
                        "downstream/<task>/model of the run):\n\n"
                        + _table(("task", "metric", "dev value"), rows))
    started = cfg.model.name_or_path
    return CardFacts(
        model_name=_model_name(cfg.trainer, f"bertkit-pretraining-{corpus.name}"),
        family="pretraining",
        summary=(f"BERT pretrained with bertkit ({record['objective']}, {record['masking']} "
                 f"masking) on {corpus.name}, "
                 + (f"continued from {model_reference(started)}." if started
                    else "from random initialisation.")),
        started_from=started,
        dataset=CardDataset.of(corpus),
        results=results, results_note=note, shown_results=shown,
        hyperparameters=record.get("hyperparameters", {}), seed=record["seed"],
        training={**{key: train[key] for key in ("steps", "planned_steps", "complete",
                                                 "tokens_seen", "training_seconds")
                     if key in train},
                  **{f"last log {key}": last[key] for key in last
                     if key.endswith(("_loss", "_accuracy"))}},
        sections=sections, usage=_usage(cfg, "pretraining"))


def base_model(started_from: str | None, settings: DictConfig) -> str | list[str] | None:
    """model_card.base_model when set; else the model the run started from when it is a Hub
    id; else the Hub model a local checkpoint names in its own card or config.json."""
    return (settings.base_model or hub_id(started_from)
            or checkpoint_base_model(started_from))


def card_metadata(facts: CardFacts, settings: DictConfig) -> ModelCardData:
    task_type, task_name = TASK_TYPES[facts.family]
    dataset = facts.dataset
    evaluations = [
        EvalResult(task_type=task_type, task_name=task_name, dataset_type=dataset.type,
                   dataset_name=dataset.name, dataset_config=dataset.config,
                   dataset_split=split, metric_type=metric, metric_name=metric,
                   metric_value=value)
        for split, scores in facts.results.items() for metric, value in scores.items()]
    tags = settings.tags
    tags = [tags] if isinstance(tags, str) else list(tags or [])
    return ModelCardData(
        model_name=facts.model_name, license=settings.license, language=settings.language,
        library_name="transformers", pipeline_tag=task_type,
        base_model=base_model(facts.started_from, settings),
        datasets=[dataset.type] if dataset.on_hub else None,
        tags=without_absolute_paths([*tags, facts.family, dataset.name]),
        eval_results=evaluations or None)


def _cell(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _short(value):
    """A float of the body's lists to 4 decimals (the metadata keeps scores whole)."""
    return round(value, 4) if isinstance(value, float) else value


def _table(header: tuple[str, ...], rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _flatten(values: dict, prefix: str = "") -> list[tuple[str, object]]:
    """Nested settings (finetuning.lora.rank) as dotted names."""
    rows = []
    for key, value in values.items():
        if isinstance(value, dict) and value:
            rows += _flatten(value, f"{prefix}{key}.")
        else:
            rows.append((f"{prefix}{key}", value))
    return rows


def one_warmup(hyperparameters: dict) -> dict:
    """Warm-up once: the record keeps warmup_ratio (None unless warmup_steps is a share, below
    1, as Trainer reads it) beside warmup_steps (W&B and metrics.json readers use both keys);
    the card shows the ratio when there is one, else the steps."""
    if "warmup_ratio" not in hyperparameters or "warmup_steps" not in hyperparameters:
        return hyperparameters
    drop = "warmup_ratio" if hyperparameters["warmup_ratio"] is None else "warmup_steps"
    return {key: value for key, value in hyperparameters.items() if key != drop}


def _started_from(name: str | None) -> str:
    if not name:
        return "random initialisation"
    reference = model_reference(name)
    return reference if reference == name else f"{reference} (a local checkpoint)"


def card_body(facts: CardFacts, command: str | None) -> str:
    """The Markdown body; every path in it portable (without_absolute_paths)."""
    shown = facts.results if facts.shown_results is None else facts.shown_results
    results = [(split, metric, f"{value:.4f}") for split, scores in shown.items()
               for metric, value in scores.items()]
    how = (f"`{without_absolute_paths(command)}`" if command else
           "run from Python, not the `bertkit` command: every setting is in config.yaml of "
           "the run directory")
    training = "".join(f"- {name}: {_cell(_short(without_absolute_paths(value)))}\n"
                       for name, value in facts.training.items())
    hyperparameters = without_absolute_paths(one_warmup(facts.hyperparameters))
    parts = [
        f"# {facts.model_name}\n\n{facts.summary}\n",
        "## Results\n\n" + facts.results_note + "\n\n"
        + (_table(("split", "metric", "value"), results) if results else ""),
        *facts.sections,
        *([facts.usage] if facts.usage else []),
        "## Training\n\n"
        f"- command: {how}\n- seed: {facts.seed}\n"
        f"- started from: {_started_from(facts.started_from)}\n{training}",
        "### Hyperparameters\n\n" + _table(("name", "value"), _flatten(hyperparameters)),
    ]
    # Any path left in the free text (a summary, a section) made portable too.
    return without_absolute_paths("\n".join(parts))


def build_card(facts: CardFacts, settings: DictConfig, command: str | None) -> ModelCard:
    """The card, parsed back by huggingface_hub (a malformed one fails here, not on the
    Hub); its settings and text with secrets masked (bertkit.secret_masking)."""
    facts = replace(facts, hyperparameters=mask_secrets(facts.hyperparameters),
                    training=mask_secrets(facts.training))
    metadata = card_metadata(facts, settings)
    return ModelCard(mask_text(f"---\n{metadata.to_yaml()}\n---\n\n{card_body(facts, command)}"))


def run_card(cfg: DictConfig, record: dict) -> ModelCard | None:
    """The card of a finetune or pretraining run from its metrics.json record; None with
    model_card.enabled=false."""
    if not cfg.model_card.enabled:
        return None
    facts = (pretraining_facts(cfg, record) if record["family"] == "pretraining"
             else finetune_facts(cfg, record))
    return build_card(facts, cfg.model_card, command_line())


def write_card(card: ModelCard | None, model_dir: Path) -> Path | None:
    """README.md into the model directory, when there is one (the main process saves it)."""
    if card is None or not model_dir.is_dir():
        return None
    return write_text_atomic(model_dir / CARD_FILE, str(card))
