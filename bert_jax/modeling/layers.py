"""Feed-forward, residual sublayers, encoder and decoder layers and stacks.

Residual placement (`config.norm_position`):
  post (Transformer, BERT):  x = LayerNorm(x + Dropout(Sublayer(x)))
  pre:                       x = x + Dropout(Sublayer(LayerNorm(x))),
                             and a final LayerNorm after the last layer.

Parameter names inside a layer: `attention` / `self_attention` /
`cross_attention` (MultiHeadAttention), `mlp` (FeedForward), and one LayerNorm
per sublayer named `<sublayer>_norm`.
"""

from __future__ import annotations

import functools
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.modeling.attention import MultiHeadAttention
from bert_jax.modeling.configs import StackConfig
from bert_jax.modeling.initializers import kernel_init, partitioned

Array = jax.Array

ACTIVATION_FNS: dict[str, Callable[[Array], Array]] = {
    "gelu": functools.partial(nn.gelu, approximate=False),
    "gelu_tanh": functools.partial(nn.gelu, approximate=True),
    "relu": nn.relu,
}


def layer_norm(config: StackConfig, name: str | None = None) -> nn.LayerNorm:
    """LayerNorm over `embed`; statistics in float32 whatever the dtype."""
    return nn.LayerNorm(
        epsilon=config.layer_norm_eps,
        dtype=config.compute_dtype,
        param_dtype=config.params_dtype,
        scale_init=partitioned(nn.initializers.ones, ("embed",)),
        bias_init=partitioned(nn.initializers.zeros, ("embed",)),
        name=name,
    )


def dense(config: StackConfig, features: int, axes: tuple[str, str],
          name: str | None = None) -> nn.Dense:
    """A Dense layer whose kernel carries logical axis names `axes`."""
    return nn.Dense(
        features,
        kernel_init=partitioned(kernel_init(config), axes),
        bias_init=partitioned(nn.initializers.zeros, (axes[1],)),
        dtype=config.compute_dtype,
        param_dtype=config.params_dtype,
        name=name,
    )


def attention(config: StackConfig, name: str, decode: bool = False) -> MultiHeadAttention:
    """MultiHeadAttention sized and typed by `config`."""
    return MultiHeadAttention(
        num_heads=config.num_heads,
        head_dim=config.head_dim,
        out_features=config.hidden_size,
        dropout_rate=config.attention_dropout_rate,
        kernel_init=kernel_init(config),
        dtype=config.compute_dtype,
        param_dtype=config.params_dtype,
        attention_impl=config.attention_impl,
        decode=decode,
        name=name,
    )


class FeedForward(nn.Module):
    """Position-wise feed-forward: Dense(mlp_dim) -> activation -> Dense(embed)."""

    config: StackConfig

    @nn.compact
    def __call__(self, x: Array) -> Array:
        """`[batch, length, embed]` -> `[batch, length, embed]`."""
        cfg = self.config
        h = dense(cfg, cfg.mlp_dim, ("embed", "mlp"), "intermediate")(x)
        h = ACTIVATION_FNS[cfg.activation](h)
        return dense(cfg, cfg.hidden_size, ("mlp", "embed"), "output")(h)


def residual(config: StackConfig, x: Array, sublayer: Callable[[Array], Array],
             norm: nn.LayerNorm, *, deterministic: bool) -> Array:
    """Dropout, residual add and LayerNorm around `sublayer`, post- or pre-norm."""
    dropout = nn.Dropout(config.dropout_rate)
    if config.norm_position == "pre":
        return x + dropout(sublayer(norm(x)), deterministic=deterministic)
    return norm(x + dropout(sublayer(x), deterministic=deterministic))


class EncoderLayer(nn.Module):
    """Self-attention and feed-forward, each in a residual block."""

    config: StackConfig

    @nn.compact
    def __call__(self, x: Array, mask: Array | None, *, head_mask: Array | None = None,
                 deterministic: bool = True) -> Array:
        """`[batch, length, embed]`, mask `[batch, 1, length, length]`,
        head_mask `[heads]` -> `[batch, length, embed]`."""
        cfg = self.config
        self_attention = attention(cfg, "attention")
        x = residual(
            cfg, x,
            lambda y: self_attention(y, y, mask, head_mask=head_mask,
                                     deterministic=deterministic),
            layer_norm(cfg, "attention_norm"), deterministic=deterministic)
        return residual(cfg, x, FeedForward(cfg, name="mlp"),
                        layer_norm(cfg, "mlp_norm"), deterministic=deterministic)


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention and feed-forward."""

    config: StackConfig
    decode: bool = False

    @nn.compact
    def __call__(self, x: Array, encoded: Array, self_mask: Array | None,
                 cross_mask: Array | None, *, self_head_mask: Array | None = None,
                 cross_head_mask: Array | None = None,
                 deterministic: bool = True) -> Array:
        """`[batch, tgt_len, embed]`, encoded `[batch, src_len, embed]`, masks
        `[batch, 1, tgt_len, tgt_len | src_len]` -> `[batch, tgt_len, embed]`."""
        cfg = self.config
        self_attention = attention(cfg, "self_attention", decode=self.decode)
        x = residual(
            cfg, x,
            lambda y: self_attention(y, y, self_mask, head_mask=self_head_mask,
                                     deterministic=deterministic),
            layer_norm(cfg, "self_attention_norm"), deterministic=deterministic)
        cross_attention = attention(cfg, "cross_attention")
        x = residual(
            cfg, x,
            lambda y: cross_attention(y, encoded, cross_mask, head_mask=cross_head_mask,
                                      deterministic=deterministic),
            layer_norm(cfg, "cross_attention_norm"), deterministic=deterministic)
        return residual(cfg, x, FeedForward(cfg, name="mlp"),
                        layer_norm(cfg, "mlp_norm"), deterministic=deterministic)


def _row(mask: Array | None, layer: int) -> Array | None:
    return None if mask is None else mask[layer]


def _skip(layer_mask: Array | None, layer: int, new: Array, old: Array) -> Array:
    """Keeps `old` (identity layer) where `layer_mask[layer]` is False."""
    if layer_mask is None:
        return new
    return jnp.where(layer_mask[layer], new, old)


class EncoderStack(nn.Module):
    """`num_layers` EncoderLayers (`layer_0` ...), a final LayerNorm if pre-norm."""

    config: StackConfig

    @nn.compact
    def __call__(self, x: Array, mask: Array | None, *, head_mask: Array | None = None,
                 layer_mask: Array | None = None, deterministic: bool = True,
                 output_hidden_states: bool = False):
        """Runs the stack.

        Args:
          x: `[batch, length, embed]` embedded inputs.
          mask: `[batch, 1, length, length]` bool attention mask.
          head_mask: `[layers, heads]` multipliers of attention probabilities.
          layer_mask: `[layers]` bool; False makes that layer the identity.
          output_hidden_states: also return the embeddings and every layer's output.

        Returns:
          `[batch, length, embed]`, and a tuple of `num_layers + 1` hidden states
          `[batch, length, embed]` (or None).
        """
        cfg = self.config
        hidden_states = [x]
        for i in range(cfg.num_layers):
            y = EncoderLayer(cfg, name=f"layer_{i}")(
                x, mask, head_mask=_row(head_mask, i), deterministic=deterministic)
            x = _skip(layer_mask, i, y, x)
            hidden_states.append(x)
        if cfg.norm_position == "pre":
            x = layer_norm(cfg, "final_norm")(x)
            hidden_states[-1] = x
        return x, (tuple(hidden_states) if output_hidden_states else None)


class DecoderStack(nn.Module):
    """`num_decoder_layers` DecoderLayers, a final LayerNorm if pre-norm."""

    config: StackConfig
    num_layers: int
    decode: bool = False

    @nn.compact
    def __call__(self, x: Array, encoded: Array, self_mask: Array | None,
                 cross_mask: Array | None, *, self_head_mask: Array | None = None,
                 cross_head_mask: Array | None = None, layer_mask: Array | None = None,
                 deterministic: bool = True) -> Array:
        """`[batch, tgt_len, embed]` -> `[batch, tgt_len, embed]`; head masks
        `[layers, heads]`, layer_mask `[layers]` as in EncoderStack."""
        cfg = self.config
        for i in range(self.num_layers):
            y = DecoderLayer(cfg, decode=self.decode, name=f"layer_{i}")(
                x, encoded, self_mask, cross_mask,
                self_head_mask=_row(self_head_mask, i),
                cross_head_mask=_row(cross_head_mask, i),
                deterministic=deterministic)
            x = _skip(layer_mask, i, y, x)
        if cfg.norm_position == "pre":
            x = layer_norm(cfg, "final_norm")(x)
        return x
