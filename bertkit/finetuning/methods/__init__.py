"""One module per finetuning method, each a registered Method (bertkit.finetuning.method):
adding a method is a module here and a preset in conf/finetuning/."""
