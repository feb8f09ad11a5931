"""LoRA (Hu et al. 2022) through peft: the adapters and the head train, the merged model is
evaluated and saved, the adapter saved beside it."""

from __future__ import annotations

from bertkit.errors import BertkitError
from bertkit.finetuning.methods import Method
from bertkit.trainer_internals import replace_model


class Lora(Method):
    @classmethod
    def check(cls, settings, num_layers=None) -> None:
        if (settings.freeze_layers or settings.freeze_embeddings
                or settings.unfreeze_every is not None):
            raise BertkitError("finetuning.lora.enabled=true trains only the adapters and the "
                               "head: it does not combine with finetuning.freeze_embeddings, "
                               "finetuning.freeze_layers or finetuning.unfreeze_every")

    def apply(self, model):
        from bertkit.finetuning.lora_adapters import add_lora

        return add_lora(model, self.settings.lora)

    def finish(self, trainer, run_dir, main) -> None:
        from bertkit.finetuning.lora_adapters import merge_lora, save_adapter, trainable_summary

        self.summary = trainable_summary(trainer.model)
        if main:
            self.summary["adapter"] = str(save_adapter(trainer.model, run_dir / "adapter"))
        # The merged model is what the family evaluates and saves like any other.
        replace_model(trainer, merge_lora(trainer.model))

    def record(self) -> dict:
        return {"lora": self.summary}
