"""The encoder-decoder Transformer (Vaswani et al. 2017) for translation.

Training calls `model.apply(params, inputs, targets)` with int token ids
`inputs` `[batch, src_len]` and `targets` `[batch, tgt_len]` and gets float32
next-token logits `[batch, tgt_len, target_vocab]` (teacher forcing): the
decoder input is the targets shifted right with `bos_id` (per segment when
sequences are packed, which `*_segmentation` and `*_positions` `[batch, len]`
describe). `bert_jax.tasks.translation` trains it.
Search calls `encode` once and then `decode` one position at a time with a
model built with `incremental=True`, whose self-attention keeps a key/value
cache (`bert_jax.evaluation.decoding` runs the search):

    model = Transformer(config, incremental=True)
    cache = model.init(rng, inputs, targets_of_max_length)["cache"]
    encoded = model.apply({"params": p}, inputs, method=model.encode)
    logits, vars = model.apply({"params": p, "cache": cache}, encoded, inputs,
                               token[:, None], method=model.decode,
                               mutable=["cache"])

Token id `pad_id` marks padding in `inputs` and `targets`.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.modeling.masks import AttentionMask
from bert_jax.modeling.configs import TransformerConfig
from bert_jax.modeling.dropout import Dropout
from bert_jax.modeling.embeddings import PositionEmbedding, token_embedding
from bert_jax.modeling.layers import DecoderStack, EncoderStack, dense

Array = jax.Array


def shift_right(targets: Array, bos_id: int, positions: Array | None = None) -> Array:
    """Decoder inputs from targets: `[batch, length]` -> `[batch, length]`.

    Prepends `bos_id` and drops the last token; with packed `positions`, every
    segment start (position 0) gets `bos_id` instead of the previous segment's
    last token.
    """
    shifted = jnp.pad(targets, ((0, 0), (1, 0)), constant_values=bos_id)[:, :-1]
    if positions is not None:
        shifted = jnp.where(positions == 0, bos_id, shifted)
    return shifted


def _default_positions(tokens: Array) -> Array:
    return jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)


class Transformer(nn.Module):
    """Encoder-decoder Transformer.

    Parameters: `source_embedding` (and `target_embedding` unless shared),
    `source_positions`/`target_positions` when learned, `encoder`, `decoder`,
    and `logits` unless `tie_output`.
    """

    config: TransformerConfig
    incremental: bool = False  # key/value cache for one-token-at-a-time decoding

    def setup(self):
        cfg = self.config
        self.source_embedding = token_embedding(cfg, cfg.vocab_size)
        if cfg.share_embeddings:
            self.target_embedding = self.source_embedding
        else:
            self.target_embedding = token_embedding(cfg, cfg.output_vocab_size)
        self.source_positions = PositionEmbedding(cfg, cfg.position)
        self.target_positions = PositionEmbedding(cfg, cfg.position,
                                                  decode=self.incremental)
        self.encoder = EncoderStack(cfg)
        self.decoder = DecoderStack(cfg, num_layers=cfg.decoder_layers,
                                    decode=self.incremental)
        self.embedding_dropout = Dropout(cfg.dropout_rate)
        if not cfg.tie_output:
            self.logits = dense(cfg, cfg.output_vocab_size, ("embed", "vocab"))

    def _embed(self, table: nn.Embed, positions_module: PositionEmbedding,
               tokens: Array, positions: Array, deterministic: bool) -> Array:
        x = table(tokens)
        if self.config.scale_embeddings:
            x = x * jnp.sqrt(jnp.asarray(self.config.hidden_size, x.dtype))
        x = x + positions_module(positions)
        return self.embedding_dropout(x, deterministic=deterministic)

    def encode(self, inputs: Array, inputs_segmentation: Array | None = None,
               inputs_positions: Array | None = None, *,
               head_mask: Array | None = None, layer_mask: Array | None = None,
               deterministic: bool = True) -> Array:
        """`[batch, src_len]` token ids -> `[batch, src_len, embed]`.

        `inputs_segmentation`/`inputs_positions` `[batch, src_len]` describe packed
        sequences; `head_mask`, `layer_mask` as in `EncoderStack`."""
        cfg = self.config
        if inputs_positions is None:  # packed rows may be longer than max_len
            cfg.check_length(inputs.shape[1], "source")
            inputs_positions = _default_positions(inputs)
        valid = inputs != cfg.pad_id
        mask = AttentionMask(query_valid=valid, key_valid=valid,
                             query_segments=inputs_segmentation,
                             key_segments=inputs_segmentation)
        x = self._embed(self.source_embedding, self.source_positions, inputs,
                        inputs_positions, deterministic)
        encoded, _ = self.encoder(x, mask, head_mask=head_mask, layer_mask=layer_mask,
                                  deterministic=deterministic)
        return encoded

    def decode(self, encoded: Array, inputs: Array, targets: Array,
               targets_segmentation: Array | None = None,
               targets_positions: Array | None = None,
               inputs_segmentation: Array | None = None, *,
               self_head_mask: Array | None = None,
               cross_head_mask: Array | None = None,
               layer_mask: Array | None = None,
               deterministic: bool = True) -> Array:
        """Next-token logits, float32 `[batch, tgt_len, target_vocab]`.

        Training (`incremental=False`): `targets` `[batch, tgt_len]` are the labels;
        the decoder sees them shifted right. Incremental decoding (`incremental=True`):
        `targets` `[batch, 1]` is the previous token, and the cache supplies the
        position and the keys/values of earlier steps.
        `encoded` `[batch, src_len, embed]` and `inputs` `[batch, src_len]` (for the
        source padding mask) come from `encode`.
        """
        cfg = self.config
        source_valid = inputs != cfg.pad_id
        if self.incremental:
            decoder_inputs = targets
            positions = _default_positions(targets)  # replaced by the cache counter
            self_mask = None  # the cache hides positions not yet decoded
            cross_mask = AttentionMask(key_valid=source_valid)
        else:
            if targets_segmentation is not None and (
                    inputs_segmentation is None or targets_positions is None):
                raise ValueError("packed targets_segmentation needs inputs_segmentation "
                                 "and targets_positions (per-segment masks, BOS, positions).")
            if targets_positions is None:
                cfg.check_length(targets.shape[1], "target")
                targets_positions = _default_positions(targets)
            positions = targets_positions
            decoder_inputs = shift_right(
                targets, cfg.bos_id,
                targets_positions if targets_segmentation is not None else None)
            target_valid = targets != cfg.pad_id
            self_mask = AttentionMask(query_valid=target_valid, key_valid=target_valid,
                                      query_segments=targets_segmentation,
                                      key_segments=targets_segmentation, causal=True)
            cross_mask = AttentionMask(query_valid=target_valid, key_valid=source_valid,
                                       query_segments=targets_segmentation,
                                       key_segments=inputs_segmentation)
        y = self._embed(self.target_embedding, self.target_positions, decoder_inputs,
                        positions, deterministic)
        y = self.decoder(y, encoded, self_mask, cross_mask,
                         self_head_mask=self_head_mask, cross_head_mask=cross_head_mask,
                         layer_mask=layer_mask, deterministic=deterministic)
        logits = self.target_embedding.attend(y) if cfg.tie_output else self.logits(y)
        return logits.astype(jnp.float32)

    def __call__(self, inputs: Array, targets: Array,
                 inputs_segmentation: Array | None = None,
                 targets_segmentation: Array | None = None,
                 inputs_positions: Array | None = None,
                 targets_positions: Array | None = None, *,
                 encoder_head_mask: Array | None = None,
                 decoder_self_head_mask: Array | None = None,
                 cross_head_mask: Array | None = None,
                 deterministic: bool = True) -> Array:
        """Teacher-forced logits: `[batch, src_len]`, `[batch, tgt_len]` ->
        float32 `[batch, tgt_len, target_vocab]`.

        `encoder_head_mask`, `decoder_self_head_mask`, `cross_head_mask`
        `[layers, heads]` multiply the attention probabilities of the encoder
        self-attention, decoder self-attention and encoder-decoder attention
        heads (0 removes a head; None, the default, changes nothing).
        """
        encoded = self.encode(inputs, inputs_segmentation, inputs_positions,
                              head_mask=encoder_head_mask,
                              deterministic=deterministic)
        return self.decode(encoded, inputs, targets, targets_segmentation,
                           targets_positions, inputs_segmentation,
                           self_head_mask=decoder_self_head_mask,
                           cross_head_mask=cross_head_mask,
                           deterministic=deterministic)
