"""bert_jax: pure-function Flax Transformers and BERT for research.

The packages, in the order data flows (config -> task -> data pipeline, model
and loss -> train loop -> checkpoints and metrics -> evaluation):

  modeling    the models as pure linen modules (BERT, the Transformer)
  data        datasets, tokenizers and grain input pipelines
  tasks       one module per experiment family, binding a model, its inputs,
              its loss and its evaluators
  training    mesh and sharding, optimizer, the train step and loop,
              checkpoints, metrics, ahead-of-time compilation
  evaluation  decoding and metrics
  convert     Hugging Face BERT weights in and out, pretrained folders
  analysis    head/layer ablation, attention maps, feature probes, sweeps

`launch/` holds the command-line entry points; `experiments/` the config files.
"""

__version__ = "0.1.0"
