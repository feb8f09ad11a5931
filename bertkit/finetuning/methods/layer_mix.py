"""A learned scalar mix of every layer's output as the head's input (Peters et al. 2018;
Tenney et al. 2019)."""

from __future__ import annotations

from bertkit.finetuning.methods import Method


class LayerMix(Method):
    def apply(self, model):
        from bertkit.finetuning.head_inputs import add_layer_mix

        self.mix = add_layer_mix(model)
        return model

    def needs_layer_groups(self) -> bool:
        return True  # the mix's weights and scale are not decayed towards uniform and zero

    def finish(self, trainer, run_dir, main) -> None:
        from bertkit.finetuning.head_inputs import scalar_mix_of

        self.mix = scalar_mix_of(trainer.model)  # under LoRA, peft trains a copy

    def record(self) -> dict:
        return {"layer_mix": {"weights": [round(float(w), 6)
                                          for w in self.mix.mixture().tolist()],
                              "gamma": round(float(self.mix.gamma.detach()), 6)}}
