"""One module per finetuning method, each a Method (bertkit.finetuning.method): adding a method
is a module here, its line in METHODS and a preset in conf/finetuning/."""

# finetuning method -> its Method class (bertkit.registry: imported on first use).
METHODS = {
    "bitfit": "bertkit.finetuning.methods.bitfit:BitFit",
    "freeze": "bertkit.finetuning.methods.freeze:Freeze",
    "gradual_unfreezing": "bertkit.finetuning.methods.gradual_unfreezing:GradualUnfreezing",
    "layer_mix": "bertkit.finetuning.methods.layer_mix:LayerMix",
    "layerwise_rates": "bertkit.finetuning.methods.layerwise_rates:LayerwiseRates",
    "lora": "bertkit.finetuning.methods.lora:Lora",
    "mean_pooling": "bertkit.finetuning.methods.mean_pooling:MeanPooling",
    "r3f": "bertkit.finetuning.methods.r3f:R3F",
    "reinit": "bertkit.finetuning.methods.reinit:Reinit",
}
