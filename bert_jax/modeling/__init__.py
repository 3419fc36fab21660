"""Pure Flax (linen) modules: no I/O, no global state.

  configs      frozen hyperparameter dataclasses and presets
  attention    scaled dot-product and multi-head attention (masks: masks.py)
  embeddings   token, segment and (learned or sinusoidal) position embeddings
  layers       feed-forward, residual sublayers, encoder/decoder layers and stacks
  transformer  the encoder-decoder Transformer (encode/decode for search)
  bert         BERT encoder, pooler and task heads
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
