"""Model FLOPs of a training step, counted from the matrix multiplications.

A matmul of `[n, k] x [k, m]` costs 2nkm FLOPs. A training step costs 3x the
forward pass (forward; backward for activations; backward for weights).
Embedding lookups, softmax, LayerNorm and elementwise work are not counted.
Lengths are the padded lengths the step computes on.

Per token and layer (d = hidden_size, m = mlp_dim):
  Q, K, V and output projections  8 d^2
  feed-forward                    4 d m
  attention QK^T and PV           4 L d for L visible keys (causal: 2 L d)
"""

from __future__ import annotations

from bert_jax.modeling.configs import BertConfig, TransformerConfig


def transformer_train_flops(config: TransformerConfig, batch: int, source_length: int,
                            target_length: int) -> float:
    """Training-step FLOPs of the encoder-decoder Transformer."""
    d, m, s, t = config.hidden_size, config.mlp_dim, source_length, target_length
    encoder_token = config.num_layers * (8 * d * d + 4 * d * m + 4 * s * d)
    decoder_token = config.decoder_layers * (
        8 * d * d + 2 * t * d          # causal self-attention
        + 4 * d * d + 4 * s * d        # cross-attention: Q and output, QK^T and PV
        + 4 * d * m)
    cross_kv_per_source_token = config.decoder_layers * 4 * d * d
    logits_token = 2 * d * config.output_vocab_size
    forward = batch * (s * (encoder_token + cross_kv_per_source_token)
                       + t * (decoder_token + logits_token))
    return 3.0 * forward


def bert_train_flops(config: BertConfig, batch: int, length: float,
                     predictions: int | None = None, num_outputs: int = 2) -> float:
    """Training-step FLOPs of BERT: encoder, pooler, and either the MLM head at
    `predictions` masked positions per sequence plus NSP (pretraining), or a
    `num_outputs`-way head on the pooled output (predictions=None)."""
    d, m, L = config.hidden_size, config.mlp_dim, length
    encoder = length * config.num_layers * (8 * d * d + 4 * d * m + 4 * L * d)
    pooler = 2 * d * d
    if predictions is None:
        heads = 2 * d * num_outputs
    else:
        heads = predictions * (2 * d * d + 2 * d * config.vocab_size) + 2 * d * 2
    return 3.0 * batch * (encoder + pooler + heads)
