"""One module per pretraining objective, each an Objective (bertkit.pretraining.objective):
adding an objective is a module here, its line in OBJECTIVES and a preset in conf/objective/."""

# objective.name -> its Objective class (bertkit.registry: imported on first use).
OBJECTIVES = {
    "mlm": "bertkit.pretraining.objectives.mlm:MaskedLM",
    "mlm_nsp": "bertkit.pretraining.objectives.mlm_nsp:NextSentencePrediction",
    "sop": "bertkit.pretraining.objectives.sop:SentenceOrderPrediction",
}
