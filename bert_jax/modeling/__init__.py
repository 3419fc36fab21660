"""The models as pure Flax (linen) modules: no I/O, no global state.

Nothing here imports from `bert_jax.data` or `bert_jax.training`; the tasks
(`bert_jax.tasks`) build these modules and the train loop applies them. Every
model takes int token ids `[batch, length]`; the task models and the Transformer
return float32 logits, `BertModel` its hidden states. The parameters are a
nested dict (a pytree) whose leaves are annotated at `init` with logical axis
names (`initializers`), which `bert_jax.training.sharding` maps to mesh axes.

The models:

  configs      frozen, validated hyperparameter dataclasses (`BertConfig`,
               `TransformerConfig`) and their presets
  bert         the BERT encoder, its pooler and task heads (pretraining,
               sequence and token classification, span QA)
  transformer  the encoder-decoder Transformer, with `encode`/`decode` for search

Their parts:

  embeddings       token, segment and position embeddings (learned or sinusoidal)
  layers           feed-forward, residual sublayers, encoder/decoder layers and stacks
  attention        scaled dot-product and multi-head attention
  lean_attention   attention's hand-written backward pass (no float32 scores kept)
  dropout          dropout masks drawn from random bytes (hidden and attention)
  masks            attention masks, dense or structured (`AttentionMask`)
  fused_attention  the fused kernels (XLA, cuDNN, splash) behind `attention_impl`
  splash           TPU splash attention under `jax.shard_map`
  precision        matmuls that accumulate in float32 whatever the compute dtype
  initializers     parameter initializers with logical axis names
  losses           weighted cross-entropy returned as sums
  flops            the model FLOPs of a training step (for MFU)
"""

from bert_jax.modeling.bert import (
    BertForPreTraining, BertForQuestionAnswering, BertForSequenceClassification,
    BertForTokenClassification, BertModel)
from bert_jax.modeling.configs import (
    BertConfig, TransformerConfig, bert_preset, transformer_preset)
from bert_jax.modeling.transformer import Transformer

__all__ = [
    "BertConfig", "TransformerConfig", "bert_preset", "transformer_preset", "Transformer",
    "BertModel", "BertForPreTraining", "BertForQuestionAnswering",
    "BertForSequenceClassification", "BertForTokenClassification",
]
