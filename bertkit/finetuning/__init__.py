"""The finetuning methods of BERTology (Rogers et al. 2020; Sun et al. 2019), written once for
every task family and configured under `finetuning.*` (conf/finetuning/): freezing,
layer-wise learning-rate decay, gradual unfreezing, re-initialising the top layers, a scalar
mix of all layers and the pooling choice, two-stage finetuning (STILTs), LoRA, the R3F
smoothness regulariser and BitFit. bertkit.finetuning.methods holds their table and applies
those the node turns on to a family's model and Trainer; layers.py, optimizer.py and
head_inputs.py are what several methods share.
"""
