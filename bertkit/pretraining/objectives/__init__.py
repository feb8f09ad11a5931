"""One module per pretraining objective, each a registered Objective
(bertkit.pretraining.objective): adding an objective is a module here and a preset in
conf/objective/."""
