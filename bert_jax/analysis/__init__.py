"""The analysis of trained models, one study per module or subpackage; each
module's docstring describes its study.

  ablation        head and layer ablation, head importance and pruning
                  (Michel et al. 2019), on BERT or the translation Transformer
  attention_maps  the attention probabilities `[layers, heads, q, k]` of a
                  model, and their plots
  encoders        a BERT encoder to analyse, loaded from wherever it lives
  features        BERT's feature-based approach: the hidden states of a frozen
                  encoder as word features, and linear probes over its layers
  sweeps          hyperparameter sweeps: their points, runs and results
  transfer        transfer studies: every backbone fine-tuned on every task
"""
