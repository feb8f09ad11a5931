"""A pretraining ablation on disk as `bertkit -m experiment=pretrain_ablation seed=...` leaves
it: per arm (masking x objective, the sweep's own grid) and seed a job directory with the
resolved config.yaml, a pretraining metrics.json of the shape pretrain() writes, and its RTE
finetune in downstream/rte/. The arms and their configs come from the sweep file and the
composed configs, so a new arm of the sweep is a new arm here."""

from __future__ import annotations

import copy
import itertools
import json
from functools import cache
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from tests.conftest import compose_config
from tests.reporting.test_run_results import glue_metrics

SWEEP_FILE = Path(__file__).parents[2] / "conf" / "sweep" / "pretrain_ablation.yaml"


@cache
def grid() -> dict[str, tuple[str, ...]]:
    """{group: values} of the ablation's sweep (masking: static, dynamic; objective: ...)."""
    params = yaml.safe_load(SWEEP_FILE.read_text())["hydra"]["sweeper"]["params"]
    return {group: tuple(str(values).split(",")) for group, values in params.items()}


def arms() -> list[dict[str, str]]:
    return [dict(zip(grid(), values, strict=True))
            for values in itertools.product(*grid().values())]


@cache
def _arm_config(items: tuple) -> dict:
    overrides = ["experiment=pretrain_ablation", *(f"{k}={v}" for k, v in items)]
    return OmegaConf.to_container(compose_config(overrides), resolve=True)


@cache
def _finetune_config() -> dict:
    return OmegaConf.to_container(compose_config(["recipe=glue", "task=rte"]), resolve=True)


def arm_config(arm: dict[str, str], seed: int) -> dict:
    config = copy.deepcopy(_arm_config(tuple(sorted(arm.items()))))
    config["seed"] = config["trainer"]["seed"] = seed
    # as a run names itself: a W&B name of its own per job (a result-neutral setting)
    config["logger"]["name"] = "-".join([config["corpus"]["name"], *arm.values(), str(seed)])
    return config


def sentence_task(arm: dict[str, str]) -> str | None:
    return _arm_config(tuple(sorted(arm.items())))["objective"]["sentence_task"]


def scores(arm: dict[str, str], seed: int) -> dict[str, float]:
    """Made-up held-out scores with an effect of each factor and a spread over seeds: dynamic
    masking lowers the MLM loss, NSP costs MLM accuracy."""
    noise = 0.01 * ((seed * 7) % 5 - 2)
    loss = 6.0 - 0.2 * (arm.get("masking") == "dynamic") + 0.1 * (sentence_task(arm) is not None)
    out = {"mlm_loss": loss + noise, "mlm_accuracy": 0.2 - loss / 100 + noise / 10}
    if sentence_task(arm):
        out[f"{sentence_task(arm)}_loss"] = 0.69 + noise
        out[f"{sentence_task(arm)}_accuracy"] = 0.6 + noise
    return out


def pretraining_metrics(arm: dict[str, str], seed: int, heldout: bool = True,
                        limited: dict | None = None, fingerprints: dict | None = None) -> dict:
    config = arm_config(arm, seed)
    final = scores(arm, seed)
    window = {k: v + 0.5 if k.endswith("loss") else v for k, v in final.items()}
    details = {"input_fingerprints": fingerprints or {"model.tokenizer": "tok0",
                                                      "corpus.files": "corpus0"}}
    if limited:
        details["limited_samples"] = limited
    return {
        "recipe": config["recipe"]["name"], "family": "pretraining",
        "corpus": config["corpus"]["name"], "objective": config["objective"]["name"],
        "masking": config["masking"]["kind"], "seed": seed,
        "last_log": {"loss": 7.0, "step": 600, **window, "num_input_tokens_seen": 2457600},
        "train": {"loss": 7.0, "steps": 600, "epochs": 1.0, "planned_steps": 600,
                  "complete": True, "seconds": 120.0 + seed, "training_seconds": 100.0,
                  "tokens_seen": 2457600 + seed},
        "hyperparameters": {"learning_rate": 0.001, "train_batch_size": 32,
                            "num_train_epochs": 3.0, "max_steps": 600, "seed": seed},
        "heldout": ({"fraction": 0.05, "sequences": 512,
                     "final": {"step": 600, **final, "tokens_seen": 2457600}}
                    if heldout else None),
        "details": details,
        "downstream": {"rte": {"main_metric": "accuracy", "main_value": 0.55}},
    }


def write_job(job: Path, arm: dict[str, str], seed: int, rte: float | None = None,
              **metrics_options) -> Path:
    """One job of the sweep; with rte, its downstream RTE finetune scoring that accuracy."""
    job.mkdir(parents=True)
    (job / "config.yaml").write_text(yaml.safe_dump(arm_config(arm, seed)))
    (job / "metrics.json").write_text(json.dumps(pretraining_metrics(arm, seed,
                                                                     **metrics_options)))
    if rte is not None:
        finetune = copy.deepcopy(_finetune_config())
        finetune["model"]["name_or_path"] = str(job / "model")
        finetune["seed"] = seed
        finetune["logger"]["name"] = f"rte-{job.parent.name}-seed{seed}"
        downstream = job / "downstream" / "rte"
        downstream.mkdir(parents=True)
        (downstream / "config.yaml").write_text(yaml.safe_dump(finetune))
        (downstream / "metrics.json").write_text(json.dumps(
            glue_metrics("rte", seed, {"validation": {"accuracy": rte}}, lr=1e-4)))
    return job


def rte_score(arm: dict[str, str], seed: int) -> float:
    """Made-up downstream accuracy: NSP helps RTE a little, dynamic masking a little less."""
    return (0.55 + 0.03 * (sentence_task(arm) is not None)
            + 0.01 * (arm.get("masking") == "dynamic") + 0.01 * ((seed * 3) % 4 - 1.5))


def write_ablation(root: Path, seeds=(1, 2, 3), downstream: bool = True) -> Path:
    """The whole sweep under root/<masking>-<objective>/seed<N>/, as Hydra names its jobs."""
    for arm, seed in itertools.product(arms(), seeds):
        name = "-".join(arm[group] for group in grid())
        write_job(root / name / f"seed{seed}", arm, seed,
                  rte=rte_score(arm, seed) if downstream else None)
    return root


def arm_name(arm: dict[str, str]) -> str:
    """A row's name as the report gives it: the settings the arms differ in."""
    return " · ".join(f"{group}={arm[group]}" for group in sorted(arm))
