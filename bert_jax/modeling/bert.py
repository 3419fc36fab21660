"""BERT (Devlin et al. 2018): embeddings, encoder, pooler and task heads.

Inputs follow Hugging Face's names: `input_ids`, `attention_mask` (1 for real
tokens, 0 for padding; all ones when omitted), `token_type_ids` (segment A/B,
zeros when omitted), `position_ids` (0..length-1 when omitted), each
`[batch, length]` int.

Outputs: `BertModel` returns a `BertOutput`: `sequence_output`
`[batch, length, hidden]`, `pooled_output` `[batch, hidden]` (the pooler on
`[CLS]`) and, on request, every hidden state. The task models return float32
logits: `BertForPreTraining` a `PreTrainingOutput` (masked LM
`[batch, predictions, vocab]` at `masked_positions`, next sentence
`[batch, 2]`), `BertForSequenceClassification` `[batch, num_labels]`,
`BertForTokenClassification` `[batch, length, num_labels]` and
`BertForQuestionAnswering` start and end logits `[batch, length]` each. The
tasks `bert_jax.tasks.bert_pretraining` and `bert_jax.tasks.finetune` train
them; `bert_jax.analysis` reads `BertModel`.

Parameter tree (what `bert_jax.convert.hf_bert` maps to and from):
  bert/embeddings/{word_embeddings, position_embeddings, token_type_embeddings, norm}
  bert/encoder/layer_<i>/{attention/{query,key,value,out}, attention_norm,
                          mlp/{intermediate,output}, mlp_norm}
  bert/pooler
  mlm/{transform, transform_norm, output_bias}, nsp           (pretraining)
  classifier                                                 (sequence, token)
  qa_outputs                                                 (span QA)
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from bert_jax.modeling.masks import AttentionMask
from bert_jax.config_schema import POOLINGS
from bert_jax.modeling.configs import ACTIVATIONS, BertConfig
from bert_jax.modeling.dropout import Dropout
from bert_jax.modeling.embeddings import PositionEmbedding, token_embedding
from bert_jax.modeling.initializers import partitioned
from bert_jax.modeling.layers import EncoderStack, dense, layer_norm

Array = jax.Array


@flax.struct.dataclass
class BertOutput:
    """sequence_output `[batch, length, hidden]`, pooled_output `[batch, hidden]`
    (tanh(W h_[CLS] + b)), hidden_states: embeddings and every layer's output,
    `num_layers + 1` arrays `[batch, length, hidden]`, when requested."""

    sequence_output: Array
    pooled_output: Array
    hidden_states: tuple[Array, ...] | None = None


@flax.struct.dataclass
class PreTrainingOutput:
    """mlm_logits `[batch, predictions, vocab]` (float32) at the masked
    positions, nsp_logits `[batch, 2]` (0 = B follows A, 1 = random B)."""

    mlm_logits: Array
    nsp_logits: Array
    bert: BertOutput


class BertEmbeddings(nn.Module):
    """word + position + token type embeddings, then LayerNorm and dropout."""

    config: BertConfig

    def setup(self):
        cfg = self.config
        self.word_embeddings = token_embedding(cfg, cfg.vocab_size)
        self.position_embeddings = PositionEmbedding(cfg, "learned")
        self.token_type_embeddings = token_embedding(cfg, cfg.type_vocab_size,
                                                     axis_name="type_vocab")
        self.norm = layer_norm(cfg)
        self.dropout = Dropout(cfg.dropout_rate)

    def __call__(self, input_ids: Array, token_type_ids: Array, position_ids: Array, *,
                 deterministic: bool = True) -> Array:
        """`[batch, length]` ids -> `[batch, length, hidden]`."""
        x = (self.word_embeddings(input_ids)
             + self.position_embeddings(position_ids)
             + self.token_type_embeddings(token_type_ids))
        return self.dropout(self.norm(x), deterministic=deterministic)

    def attend(self, x: Array) -> Array:
        """`[..., hidden]` -> `[..., vocab]` logits against the word embeddings."""
        return self.word_embeddings.attend(x)


class BertModel(nn.Module):
    """The BERT encoder with its pooler."""

    config: BertConfig

    def setup(self):
        cfg = self.config
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = EncoderStack(cfg)
        self.pooler = dense(cfg, cfg.hidden_size, ("embed", "mlp"))

    def __call__(self, input_ids: Array, attention_mask: Array | None = None,
                 token_type_ids: Array | None = None, position_ids: Array | None = None,
                 *, head_mask: Array | None = None, layer_mask: Array | None = None,
                 deterministic: bool = True,
                 output_hidden_states: bool = False) -> BertOutput:
        """Encodes `[batch, length]` ids; `head_mask`, `layer_mask` and
        `output_hidden_states` as in `EncoderStack`. Attention probabilities are
        sown in `intermediates` (see attention.py)."""
        self.config.check_length(input_ids.shape[1])
        if attention_mask is None:
            attention_mask = jnp.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        if position_ids is None:
            position_ids = jnp.broadcast_to(jnp.arange(input_ids.shape[1]),
                                            input_ids.shape)
        x = self.embeddings(input_ids, token_type_ids, position_ids,
                            deterministic=deterministic)
        # Padding keys are hidden; padding queries still attend (as in BERT).
        mask = AttentionMask(key_valid=attention_mask.astype(bool))
        sequence_output, hidden_states = self.encoder(
            x, mask, head_mask=head_mask, layer_mask=layer_mask,
            deterministic=deterministic, output_hidden_states=output_hidden_states)
        pooled_output = jnp.tanh(self.pooler(sequence_output[:, 0]))
        return BertOutput(sequence_output, pooled_output, hidden_states)

    def attend(self, x: Array) -> Array:
        """Logits against the word embeddings (the tied MLM decoder)."""
        return self.embeddings.attend(x)


class MaskedLMHead(nn.Module):
    """transform (Dense + activation + LayerNorm), then logits against the word
    embeddings plus an output bias (the decoder is tied, as in BERT)."""

    config: BertConfig

    @nn.compact
    def __call__(self, hidden: Array, attend) -> Array:
        """`[..., hidden]` -> float32 `[..., vocab]`; `attend` maps to vocabulary."""
        cfg = self.config
        h = dense(cfg, cfg.hidden_size, ("embed", "mlp"), "transform")(hidden)
        h = ACTIVATIONS[cfg.activation](h)
        h = layer_norm(cfg, "transform_norm")(h)
        bias = self.param("output_bias", partitioned(nn.initializers.zeros, ("vocab",)),
                          (cfg.vocab_size,), cfg.params_dtype)
        return (attend(h) + bias).astype(jnp.float32)


class _BertWithHead(nn.Module):
    """A BertModel named `bert` (and dropout), for task models to add heads to."""

    config: BertConfig

    def setup(self):
        self.bert = BertModel(self.config)
        self.dropout = Dropout(self.config.dropout_rate)

    def encode(self, input_ids, attention_mask=None, token_type_ids=None, *,
               deterministic: bool = True, **bert_kwargs: Any) -> BertOutput:
        return self.bert(input_ids, attention_mask, token_type_ids,
                         deterministic=deterministic, **bert_kwargs)


class BertForPreTraining(_BertWithHead):
    """Masked-LM and next-sentence-prediction heads."""

    def setup(self):
        super().setup()
        self.mlm = MaskedLMHead(self.config)
        self.nsp = dense(self.config, 2, ("embed", "classes"))

    def __call__(self, input_ids: Array, attention_mask: Array | None = None,
                 token_type_ids: Array | None = None,
                 masked_positions: Array | None = None, *,
                 deterministic: bool = True, **bert_kwargs: Any) -> PreTrainingOutput:
        """`masked_positions` `[batch, predictions]`: the MLM head runs only there
        (the original BERT); None runs it at every position."""
        out = self.encode(input_ids, attention_mask, token_type_ids,
                          deterministic=deterministic, **bert_kwargs)
        hidden = out.sequence_output
        if masked_positions is not None:  # -> [batch, predictions, hidden]
            hidden = jnp.take_along_axis(hidden, masked_positions[..., None], axis=1)
        mlm_logits = self.mlm(hidden, self.bert.attend)
        nsp_logits = self.nsp(out.pooled_output).astype(jnp.float32)
        return PreTrainingOutput(mlm_logits, nsp_logits, out)


def mean_pool(sequence: Array, attention_mask: Array | None) -> Array:
    """`[batch, length, hidden]` -> `[batch, hidden]`: the mean over real tokens
    (summed in float32, returned in the sequence's dtype)."""
    if attention_mask is None:
        attention_mask = jnp.ones(sequence.shape[:2])
    weights = attention_mask.astype(jnp.float32)[..., None]
    total = (sequence.astype(jnp.float32) * weights).sum(axis=1)
    return (total / jnp.maximum(weights.sum(axis=1), 1.0)).astype(sequence.dtype)


class BertForSequenceClassification(_BertWithHead):
    """A Dense head on a pooled sequence: classes, or `num_labels=1` for
    regression. Returns float32 `[batch, num_labels]`.

    `pooling`: 'cls' (BERT: the pooler, Dense + tanh, on [CLS]) or 'mean' (the
    mean of the last layer over real tokens, as Sentence-BERT models such as
    all-MiniLM-L6-v2 were trained; the pooler is then unused).
    """

    num_labels: int = 2
    pooling: str = "cls"

    def setup(self):
        super().setup()
        if self.pooling not in POOLINGS:
            raise ValueError(f"config.head.pooling={self.pooling!r}: unknown; choose one "
                             f"of {list(POOLINGS)}.")
        self.classifier = dense(self.config, self.num_labels, ("embed", "classes"))

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *,
                 deterministic: bool = True, **bert_kwargs: Any) -> Array:
        out = self.encode(input_ids, attention_mask, token_type_ids,
                          deterministic=deterministic, **bert_kwargs)
        pooled = (out.pooled_output if self.pooling == "cls"
                  else mean_pool(out.sequence_output, attention_mask))
        pooled = self.dropout(pooled, deterministic=deterministic)
        return self.classifier(pooled).astype(jnp.float32)


class BertForTokenClassification(_BertWithHead):
    """A Dense head on every token. Returns float32 `[batch, length, num_labels]`."""

    num_labels: int = 2

    def setup(self):
        super().setup()
        self.classifier = dense(self.config, self.num_labels, ("embed", "classes"))

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *,
                 deterministic: bool = True, **bert_kwargs: Any) -> Array:
        out = self.encode(input_ids, attention_mask, token_type_ids,
                          deterministic=deterministic, **bert_kwargs)
        hidden = self.dropout(out.sequence_output, deterministic=deterministic)
        return self.classifier(hidden).astype(jnp.float32)


class BertForQuestionAnswering(_BertWithHead):
    """Span QA: start and end logits for every token, float32 `[batch, length]`."""

    def setup(self):
        super().setup()
        self.qa_outputs = dense(self.config, 2, ("embed", "classes"))

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *,
                 deterministic: bool = True, **bert_kwargs: Any) -> tuple[Array, Array]:
        out = self.encode(input_ids, attention_mask, token_type_ids,
                          deterministic=deterministic, **bert_kwargs)
        logits = self.qa_outputs(out.sequence_output).astype(jnp.float32)
        return logits[..., 0], logits[..., 1]
