"""LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models") through peft:
the pretrained weights stay frozen and low-rank adapters B @ A (B starts at zero) are trained on
the target modules (by default the attention's query and value projections).

The known peft pitfall: a finetuned model's task head (classifier, qa_outputs, ...) is new, not
pretrained, so it must train in full and be saved with the adapter. peft trains and saves only
the adapters unless the head is listed in `modules_to_save`; without it the head stays at its
random initialisation and a reloaded adapter predicts with a different random head. add_lora
therefore always puts the head modules (layers.head_module_names, the scalar mix included) in
`modules_to_save`. peft trains a copy of each of those modules (<name>.modules_to_save.default)
and keeps the frozen original beside it (<name>.original_module).

The method: the adapters and the head train, the merged model is evaluated and saved, the
adapter saved beside it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import peft
from torch import nn
from transformers import PreTrainedModel
from transformers.utils import find_labels

from bertkit.data.atomic_files import follow_umask
from bertkit.errors import BertkitError
from bertkit.finetuning.layers import encoder, head_module_names
from bertkit.finetuning.methods import Method
from bertkit.training.trainer import replace_model


class Lora(Method):
    @classmethod
    def check(cls, settings, num_layers=None) -> None:
        if (settings.freeze_layers or settings.freeze_embeddings
                or settings.unfreeze_every is not None):
            raise BertkitError("finetuning.lora.enabled=true trains only the adapters and the "
                               "head: it does not combine with finetuning.freeze_embeddings, "
                               "finetuning.freeze_layers or finetuning.unfreeze_every")

    def apply(self, model):
        return add_lora(model, self.settings.lora)

    def finish(self, trainer, run_dir, main) -> None:
        self.summary = trainable_summary(trainer.model)
        if main:
            self.summary["adapter"] = str(save_adapter(trainer.model, run_dir / "adapter"))
        # The merged model is what the family evaluates and saves like any other.
        replace_model(trainer, merge_lora(trainer.model))

    def record(self) -> dict:
        return {"lora": self.summary}


KEY = "finetuning.lora"

# The layer types peft's LoRA can adapt in a BERT model (a target must name one of these).
_ADAPTABLE = (nn.Linear, nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d)

# peft's task-specific wrappers, by the task model's class-name suffix. Multiple choice has none:
# it gets a plain PeftModel (forward(*args, **kwargs); the Trainer unwraps peft models to find
# the label names, and label_names() gives them for anything that does not).
_TASK_TYPES = {
    "ForSequenceClassification": peft.TaskType.SEQ_CLS,
    "ForTokenClassification": peft.TaskType.TOKEN_CLS,
    "ForQuestionAnswering": peft.TaskType.QUESTION_ANS,
}


def _suffix_match(name: str, target: str) -> bool:
    """peft's rule for a list of names: the module's full name is the target or ends in
    '.<target>'."""
    return name == target or name.endswith("." + target)


def _names(value, key: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, Iterable) or not all(isinstance(v, str) and v for v in value):
        raise BertkitError(f"{KEY}.{key}={value!r}: must be a list of module names")
    return list(value)


def _task_type(model: nn.Module) -> peft.TaskType | None:
    name = type(model).__name__
    return next((task for suffix, task in _TASK_TYPES.items() if name.endswith(suffix)), None)


def _check_targets(model: nn.Module, targets: list[str], heads: list[str]) -> None:
    if not targets:
        raise BertkitError(f"{KEY}.target_modules=[]: name at least one module to adapt "
                           f"(e.g. [query, value])")
    modules = [(name, module) for name, module in model.named_modules()
               if not any(name == h or name.startswith(h + ".") for h in heads)]
    missing = [t for t in targets
               if not any(_suffix_match(name, t) and isinstance(module, _ADAPTABLE)
                          for name, module in modules)]
    if missing:
        layer0 = encoder(model).encoder.layer[0]
        present = [name for name, module in layer0.named_modules()
                   if isinstance(module, nn.Linear)]
        raise BertkitError(
            f"{KEY}.target_modules={targets}: {missing} match no Linear, Embedding or Conv "
            f"module of {type(model).__name__} outside its head (a target is a name suffix); "
            f"the Linear modules of encoder layer 0 are {present}")


def _modules_to_save(model: nn.Module, requested, heads: list[str]) -> list[str]:
    if requested is None:
        return list(heads)
    requested = _names(requested, "modules_to_save")
    names = [name for name, _ in model.named_modules()]
    unknown = [m for m in requested if not any(_suffix_match(name, m) for name in names)]
    if unknown:
        raise BertkitError(f"{KEY}.modules_to_save={requested}: {unknown} name no module of "
                           f"{type(model).__name__} (the task head {heads} is always saved)")
    return list(dict.fromkeys([*requested, *heads]))


def _pooler(model: nn.Module, settings) -> list[str]:
    """BERT's pooler, by its full name, when settings.train_pooler asks and the model has one.
    Hu et al. train RoBERTa's whole classification head, whose dense layer is what BERT keeps
    inside the encoder as the pooler; frozen, a checkpoint whose pooler was never trained
    (sentence-transformers' MiniLM) gives the classifier near-constant inputs."""
    train = getattr(settings, "train_pooler", False)
    if not isinstance(train, bool):
        raise BertkitError(f"{KEY}.train_pooler={train!r}: expected true or false")
    if not train or getattr(encoder(model), "pooler", None) is None:
        return []
    prefix = getattr(model, "base_model_prefix", "")  # a task model, never a peft one here
    return [f"{prefix}.pooler" if hasattr(model, prefix) else "pooler"]


def add_lora(model: PreTrainedModel, settings) -> peft.PeftModel:
    """Wrap a task model for LoRA: frozen weights, adapters of rank settings.r (scale
    settings.alpha / r, dropout settings.dropout) on every module whose name ends in one of
    settings.target_modules, and the task head (plus BERT's pooler if settings.train_pooler,
    plus settings.modules_to_save) trained and saved in full. Exactly the adapters' and those
    modules' parameters require grad. r, alpha and dropout are held to LoraSchema (the
    schema's check_ranges) before a finetune starts."""
    if isinstance(model, peft.PeftModel):
        raise BertkitError(f"{KEY}: the model is already wrapped by peft; apply LoRA once")
    targets = _names(getattr(settings, "target_modules", None), "target_modules")
    heads = head_module_names(model)
    _check_targets(model, targets, heads)
    to_save = _modules_to_save(model, getattr(settings, "modules_to_save", None), heads)
    to_save = list(dict.fromkeys([*to_save, *_pooler(model, settings)]))
    config = peft.LoraConfig(r=settings.r, lora_alpha=float(settings.alpha),
                             lora_dropout=float(settings.dropout),
                             target_modules=targets, modules_to_save=to_save, bias="none",
                             task_type=_task_type(model))
    wrapped = peft.get_peft_model(model, config)
    # peft freezes everything but the adapters and the modules_to_save copies already; this
    # pins the contract whatever requires_grad the task model came with.
    for name, param in wrapped.named_parameters():
        param.requires_grad_("lora_" in name or ".modules_to_save." in name)
    return wrapped


def label_names(model: nn.Module) -> list[str]:
    """The label arguments of the (wrapped) task model's forward, e.g. ['labels'], or
    ['start_positions', 'end_positions'] for question answering: TrainingArguments.label_names.
    The Trainer of transformers 5 finds them itself (it unwraps peft models); this is for
    code that inspects a plain PeftModel's forward(*args, **kwargs)."""
    inner = getattr(model, "get_base_model", None)
    base = inner() if callable(inner) else model
    return find_labels(type(base))


def merge_lora(model: peft.PeftModel) -> PreTrainedModel:
    """Fold the adapters into the frozen weights (W + alpha / r * B @ A) and return the plain
    task model, with the trained head in place of the original: same predictions in eval mode,
    saveable and loadable as an ordinary checkpoint. Its parameters all require grad again,
    as after from_pretrained. The PeftModel shares the modules and is spent afterwards."""
    if not isinstance(model, peft.PeftModel):
        raise BertkitError(f"{KEY}: merge_lora needs the peft model add_lora returned, "
                           f"not {type(model).__name__}")
    merged = model.merge_and_unload()
    merged.requires_grad_(True)
    return merged


def save_adapter(model: peft.PeftModel, directory: str | Path) -> Path:
    """Save the adapter weights and the modules_to_save (the task head) with peft's
    save_pretrained (adapter_config.json, adapter_model.safetensors); reload with
    peft.PeftModel.from_pretrained(<the pre-LoRA task model>, directory)."""
    if not isinstance(model, peft.PeftModel):
        raise BertkitError(f"{KEY}: save_adapter needs the peft model add_lora returned, "
                           f"not {type(model).__name__}")
    missing = [h for h in head_module_names(model) if h not in (model.modules_to_save or ())]
    if missing:
        raise BertkitError(f"{KEY}.modules_to_save: the task head {missing} is not saved with "
                           f"the adapter; a reloaded model would predict with a random head")
    directory = Path(directory)
    model.save_pretrained(str(directory))
    follow_umask(directory)
    return directory


def trainable_summary(model: nn.Module) -> dict:
    """Trainable and all parameter counts (shared tensors once) for metrics.json. Under peft,
    'all' counts the adapters and both the frozen original and the trained copy of the head."""
    params = list(model.parameters())  # deduplicated by tensor identity (tied weights once)
    total = sum(p.numel() for p in params)
    trainable = sum(p.numel() for p in params if p.requires_grad)
    return {"trainable_parameters": int(trainable), "all_parameters": int(total),
            "trainable_share": trainable / total if total else 0.0}


__all__ = ["add_lora", "label_names", "merge_lora", "save_adapter", "trainable_summary"]
