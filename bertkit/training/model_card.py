"""The Hub model card (README.md) of every saved model directory, and the Hub push that
carries it.

training.run.publish writes <run dir>/model/README.md right after metrics.json, from the same
record, so that a model directory copied or uploaded anywhere says what it is: YAML metadata in the
Hub's format (model-index with the dev scores, license, base model, tags) and a body with the
results, a usage snippet, the command, the seed and the hyperparameters. No absolute path of the
training machine appears in it (bertkit.training.card_provenance). Settings: the model_card
node of conf/config.yaml.

With trainer.push_to_hub=true the model goes up through Trainer's own push_to_hub, once, at
the end of the run (training.run.push_if_asked), with this card as its README.md (HubTrainer).
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from transformers import Trainer

from bertkit.data.atomic_files import follow_umask, write_text_atomic
from bertkit.errors import BertkitError
from bertkit.secret_masking import mask_secrets, mask_text
from bertkit.training.card_provenance import (
    CARD_FILE,
    checkpoint_base_model,
    hub_id,
    is_repo_id,
    model_reference,
    without_absolute_paths,
)
from bertkit.training.card_usage import usage_section
from bertkit.training.lean_step import LeanStepTrainer

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
        path = OmegaConf.select(node, "hub.path", default=None)
        config = OmegaConf.select(node, "hub.name", default=None)
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
    training: dict = field(default_factory=dict)  # steps, loss, ...: the body's facts
    sections: list[str] = field(default_factory=list)  # further Markdown sections
    usage: str | None = None  # the `## Usage` section (bertkit.training.card_usage)


def command_line() -> str | None:
    """`bertkit <overrides>` of the running Hydra job (a sweep's job: its own values); None
    outside one (finetune or pretrain called from Python)."""
    if not HydraConfig.initialized():
        return None
    overrides = mask_secrets(list(HydraConfig.get().overrides.task))
    return " ".join(["bertkit", *(shlex.quote(o) for o in overrides)])


def check_hub_settings(cfg: DictConfig) -> None:
    """Before any data is read: without hub_model_id Trainer would name the repository after
    the checkpoint folder ("checkpoints"); a base_model the card gives must be a Hub id."""
    if OmegaConf.select(cfg, "trainer.push_to_hub", default=False) \
            and not OmegaConf.select(cfg, "trainer.hub_model_id"):
        raise BertkitError("trainer.push_to_hub=true needs trainer.hub_model_id=<user>/<name>, "
                           "the Hub repository to push to")
    base = OmegaConf.select(cfg, "model_card.base_model")
    if base and not is_repo_id(str(base)):
        raise BertkitError(f"model_card.base_model={base}: expected the Hub id of a model "
                           f"(<user>/<name>), not a path")


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


def _model_name(trainer: DictConfig, default: str) -> str:
    hub_model_id = trainer.get("hub_model_id")
    return hub_model_id.split("/")[-1] if hub_model_id else default


def _pushed_id(trainer: DictConfig) -> str | None:
    """The model's Hub id when the run pushes it (trainer.push_to_hub)."""
    if trainer.get("push_to_hub", False):
        return trainer.get("hub_model_id")
    return None


def _usage(cfg: DictConfig, family: str) -> str | None:
    task = OmegaConf.select(cfg, "task")
    return usage_section(
        family, _pushed_id(cfg.trainer),
        pair=bool(OmegaConf.select(task, "columns.text_b", default=None)) if task else False,
        regression=family == "glue" and OmegaConf.select(task, "labels") is None,
        feature_based=bool(OmegaConf.select(cfg, "model.feature_based.enabled", default=False)))


# A finetune's training facts in its card: metrics.json's train key -> the card's name.
FINETUNE_TRAINING_FACTS = {"steps": "steps", "planned_steps": "planned_steps",
                           "complete": "complete", "loss": "mean training loss (every step)",
                           "training_seconds": "training_seconds"}


def finetune_facts(cfg: DictConfig, record: dict) -> CardFacts:
    """A finetune's card from its metrics.json record (bertkit.data.metrics_file)."""
    family, task = record["family"], cfg.task
    started = None if record["model"] == "from_scratch" else record["model"]
    origin = f"from {model_reference(started)}" if started else "from random initialisation"
    train = record.get("train", {})
    return CardFacts(
        model_name=_model_name(cfg.trainer, f"bertkit-{task.name}"), family=family,
        summary=(f"BERT finetuned on {task.name} ({family} family, "
                 f"{TASK_TYPES[family][0]}) with bertkit, {origin}."),
        started_from=started, dataset=CardDataset.of(task),
        results=_scores({**record["validation"], **record.get("test", {})}),
        results_note=(f"The final model on the dev split(s)"
                      f"{' and the labelled test split(s)' if record.get('test') else ''}, as in "
                      f"the run's metrics.json; main metric: {record['main_metric']}."),
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
    if final:
        results = {"heldout": heldout_scores(final)}
        note = (f"Held-out masked positions (heldout.fraction={heldout['fraction']} of the "
                f"corpus's documents, never trained on): {heldout['sequences']} sequences, "
                f"{heldout['masked_positions']} masked positions, at step {final['step']}.")
    last = record.get("last_log") or {}
    train = record.get("train", {})
    sections = []
    downstream = record.get("downstream") or {}
    if downstream:
        rows = [(task, result["main_metric"], f"{result['main_value']:.4f}")
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
        results=results, results_note=note,
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
    results = [(split, metric, f"{value:.4f}") for split, scores in facts.results.items()
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


class HubTrainer(LeanStepTrainer):
    """Trainer whose Hub push carries bertkit's card. bertkit pushes once, at the end of
    the run (push_model); Trainer's save_model would push by itself when the job saves
    <run dir>/model, before metrics.json and the card exist, so a save here never pushes; and
    the README.md that push_to_hub uploads is bertkit's card, not Trainer's draft."""

    hub_card: str | None = None  # set by push_with_card

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        super().save_model(output_dir, _internal_call=True)
        if self.args.should_save:  # checkpoints come here too (Trainer._save_checkpoint)
            follow_umask(output_dir or self.args.output_dir)

    def create_model_card(self, **kwargs) -> None:
        if self.hub_card is None:  # model_card.enabled=false: Trainer's own card
            return super().create_model_card(**kwargs)
        if self.is_world_process_zero():
            write_text_atomic(Path(self.args.output_dir) / CARD_FILE, self.hub_card)

    def init_hf_repo(self, token: str | None = None, **kwargs) -> None:
        # Network, login and permission errors come in many types (httpx's, OSError, the
        # Hub's HTTP errors): whichever it is, one message naming the settings. **kwargs:
        # whatever this transformers passes (`private` in newer releases).
        try:
            super().init_hf_repo(token=token, **kwargs)
        except Exception as err:
            raise BertkitError(
                f"trainer.push_to_hub=true: cannot create or reach the Hub repository "
                f"trainer.hub_model_id={self.args.hub_model_id} "
                f"({type(err).__name__}: {err}); log in with `hf auth login` (or set "
                f"HF_TOKEN), or set trainer.push_to_hub=false") from err

    def push_with_card(self, card: str | None, model_dir: Path):
        """Trainer.push_to_hub (the model saved into args.output_dir and that folder uploaded)
        with `card` as its README.md; every process calls it (a sharded model saves from
        all)."""
        self.hub_card = card
        try:
            return self.push_to_hub(commit_message="bertkit: model and card at the end of "
                                                   "training")
        except Exception as err:  # as in init_hf_repo: any failure of the upload
            repo = self.hub_model_id or self.args.hub_model_id
            raise BertkitError(
                f"trainer.push_to_hub=true: pushing to {repo} failed "
                f"({type(err).__name__}: {err}); the model and its card are saved in "
                f"{model_dir}: upload them with `hf upload {repo} {model_dir}`") from err


def push_model(trainer: Trainer, card: ModelCard | None, model_dir: Path):
    """The end of a run with trainer.push_to_hub=true: the model and its card to the Hub."""
    if not isinstance(trainer, HubTrainer):
        raise TypeError(f"{type(trainer).__name__} is not a HubTrainer: its push would upload "
                        f"Trainer's own card and push on every save_model")
    return trainer.push_with_card(None if card is None else str(card), model_dir)
