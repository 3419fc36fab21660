"""The layers both models are built of: feed-forward, residual sublayers,
encoder and decoder layers, and the stacks of them.

Every layer maps activations `[batch, length, embed]` in the compute dtype to
the same shape. `EncoderStack` (BERT's encoder and the Transformer's) takes
the embedded inputs and a mask (an `AttentionMask`, or a dense bool
`[batch, 1, length, length]`) and returns the last layer's output, and with
`output_hidden_states` the embeddings and every layer's output as well
(`num_layers + 1` arrays). `DecoderStack` also takes the encoder's output
`[batch, src_len, embed]`. Optional `head_mask` `[layers, heads]` multipliers
and a `layer_mask` `[layers]` of bools (False: that layer is the identity)
serve the ablations (`bert_jax.analysis.ablation`). `batch_sharded` keeps
activations split along the batch over the mesh in context.

Residual placement (`config.norm_position`):
  post (Transformer, BERT):  x = LayerNorm(x + Dropout(Sublayer(x)))
  pre:                       x = x + Dropout(Sublayer(LayerNorm(x))),
                             and a final LayerNorm after the last layer.

Parameter names inside a layer: `attention` / `self_attention` /
`cross_attention` (MultiHeadAttention), `mlp` (FeedForward), and one LayerNorm
per sublayer named `<sublayer>_norm`. A stack names its layers `layer_0`, ...;
with `config.scan_layers` it runs them as one `nn.scan` whose parameters sit
under `layers/layer` with a leading `[num_layers]` axis (`scan_params` and
`unscan_params` convert between the two layouts). `config.remat` wraps each
layer in `nn.remat` with the named checkpoint policy, or ('attention') has the
attention recompute its probabilities in the backward pass (`lean_attention`).
"""

from __future__ import annotations

import math
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from bert_jax.modeling.attention import MultiHeadAttention
from bert_jax.modeling.configs import ACTIVATIONS, REMAT_POLICIES, StackConfig
from bert_jax.modeling.dropout import Dropout
from bert_jax.modeling.initializers import kernel_init, partitioned
from bert_jax.modeling.masks import Mask
from bert_jax.modeling.precision import float32_accumulation

Array = jax.Array

BATCH_MESH_AXES = ("data", "fsdp")  # the mesh axes that split the batch
# The scanned stack of layers (`scan_layers`): the module whose params, cache and
# intermediates hold every layer's, stacked on a leading axis, and that axis's
# logical name (sharding rules, `nn.PARTITION_NAME`).
SCANNED_LAYERS = "layers"


def batch_sharded(x: Array) -> Array:
    """`[batch, ...]` split along the batch over the mesh in context (`jax.set_mesh`)
    and whole along the other dimensions; unchanged without a mesh. Without the
    constraint XLA may follow the FSDP-sharded weights and gather the whole
    batch's activations on every device (measured: per-device temporaries
    growing with the device count). Axes already manual (inside `jax.shard_map`,
    where `x` is a device's own rows) are left out."""
    mesh = jax.sharding.get_abstract_mesh()
    axes = tuple(a for a in BATCH_MESH_AXES if not mesh.empty and a in mesh.axis_names
                 and a not in mesh.manual_axes)
    if not axes or x.shape[0] % math.prod(mesh.shape[a] for a in axes):
        return x
    return jax.lax.with_sharding_constraint(x, PartitionSpec(axes))


def layer_norm(config: StackConfig, name: str | None = None) -> nn.LayerNorm:
    """LayerNorm over `embed`; statistics in float32 whatever the dtype."""
    return nn.LayerNorm(
        epsilon=config.layer_norm_eps, dtype=config.compute_dtype,
        param_dtype=config.params_dtype,
        scale_init=partitioned(nn.initializers.ones, ("embed",)),
        bias_init=partitioned(nn.initializers.zeros, ("embed",)), name=name)


def dense(config: StackConfig, features: int, axes: tuple[str, str],
          name: str | None = None) -> nn.Dense:
    """A Dense layer whose kernel carries logical axis names `axes`."""
    return nn.Dense(
        features, kernel_init=partitioned(kernel_init(config), axes),
        bias_init=partitioned(nn.initializers.zeros, (axes[1],)),
        dtype=config.compute_dtype, param_dtype=config.params_dtype,
        dot_general=float32_accumulation, name=name)


def attention(config: StackConfig, name: str, decode: bool = False) -> MultiHeadAttention:
    """The `MultiHeadAttention` of a layer, configured from `config`; `decode`:
    keep a key/value cache (decoder self-attention during search)."""
    return MultiHeadAttention(
        num_heads=config.num_heads, head_dim=config.head_dim,
        out_features=config.hidden_size, dropout_rate=config.attention_dropout_rate,
        kernel_init=kernel_init(config), dtype=config.compute_dtype,
        param_dtype=config.params_dtype, attention_impl=config.attention_impl,
        decode=decode, recompute_probabilities=config.remat == "attention", name=name)


class FeedForward(nn.Module):
    """Position-wise feed-forward: `[batch, length, embed]` -> Dense(mlp_dim) ->
    activation -> Dense(embed)."""

    config: StackConfig

    @nn.compact
    def __call__(self, x: Array) -> Array:
        cfg = self.config
        h = dense(cfg, cfg.mlp_dim, ("embed", "mlp"), "intermediate")(x)
        h = ACTIVATIONS[cfg.activation](h)
        return dense(cfg, cfg.hidden_size, ("mlp", "embed"), "output")(h)


def residual(config: StackConfig, x: Array, sublayer: Callable[[Array], Array],
             norm: nn.LayerNorm, *, deterministic: bool) -> Array:
    """Dropout, residual add and LayerNorm around `sublayer`, post- or pre-norm."""
    dropout = Dropout(config.dropout_rate)
    if config.norm_position == "pre":
        return x + dropout(sublayer(norm(x)), deterministic=deterministic)
    return norm(x + dropout(sublayer(x), deterministic=deterministic))


class EncoderLayer(nn.Module):
    """Self-attention and feed-forward, each in a residual block."""

    config: StackConfig

    @nn.compact
    def __call__(self, x: Array, mask: Mask, head_mask: Array | None = None,
                 deterministic: bool = True) -> Array:
        """`[batch, length, embed]`, mask (`AttentionMask` or `[batch, 1, length,
        length]`), head_mask `[heads]` -> `[batch, length, embed]`."""
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
    def __call__(self, x: Array, encoded: Array, self_mask: Mask, cross_mask: Mask,
                 self_head_mask: Array | None = None,
                 cross_head_mask: Array | None = None,
                 deterministic: bool = True) -> Array:
        """`[batch, tgt_len, embed]`, encoded `[batch, src_len, embed]`, masks
        (`AttentionMask` or `[batch, 1, tgt_len, tgt_len | src_len]`) ->
        `[batch, tgt_len, embed]`."""
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


def _layer(cls: type[nn.Module], config: StackConfig, **kwargs) -> nn.Module:
    """`cls(config, **kwargs)`, under `nn.remat` when `config.remat` asks for it
    (`deterministic`, a layer's last positional argument, is then static;
    'attention' wraps nothing: the attention recomputes its own probabilities)."""
    if REMAT_POLICIES[config.remat] is not None:
        num_args = {EncoderLayer: 4, DecoderLayer: 7}[cls]  # counting `self`
        cls = nn.remat(cls, policy=REMAT_POLICIES[config.remat],
                       prevent_cse=not config.scan_layers, static_argnums=(num_args,))
    return cls(config, **kwargs)


def _step(layer: nn.Module, x: Array, layer_mask: Array | None, *args) -> Array:
    """`layer(x, *args)`, or `x` (the identity) where `layer_mask` is False."""
    y = layer(x, *args)
    return batch_sharded(y if layer_mask is None else jnp.where(layer_mask, y, x))


def _row(per_layer: Array | None, layer: int) -> Array | None:
    return None if per_layer is None else per_layer[layer]


def _scan(body: type[nn.Module], num_layers: int, num_broadcast: int) -> type[nn.Module]:
    """`body` (carry, per-layer inputs, *broadcast inputs) -> (carry, output)
    scanned over `num_layers`, with stacked parameters and per-layer RNGs."""
    return nn.scan(body, variable_axes={"params": 0, "intermediates": 0, "cache": 0},
                   split_rngs={"params": True, "dropout": True},
                   in_axes=(0,) + (nn.broadcast,) * num_broadcast,
                   length=num_layers, metadata_params={nn.PARTITION_NAME: SCANNED_LAYERS})


class _EncoderScanBody(nn.Module):
    """`(x, (head_mask row, layer_mask entry), mask)` -> `(x, x or None)`."""

    config: StackConfig
    deterministic: bool
    output_hidden_states: bool

    @nn.compact
    def __call__(self, x, per_layer, mask):
        head_mask, layer_mask = per_layer
        x = _step(_layer(EncoderLayer, self.config, name="layer"), x, layer_mask,
                  mask, head_mask, self.deterministic)
        return x, (x if self.output_hidden_states else None)


class _DecoderScanBody(nn.Module):
    """`(x, (self, cross head_mask rows, layer_mask entry), encoded, self_mask,
    cross_mask)` -> `(x, None)`."""

    config: StackConfig
    decode: bool
    deterministic: bool

    @nn.compact
    def __call__(self, x, per_layer, encoded, self_mask, cross_mask):
        self_head_mask, cross_head_mask, layer_mask = per_layer
        layer = _layer(DecoderLayer, self.config, decode=self.decode, name="layer")
        return _step(layer, x, layer_mask, encoded, self_mask, cross_mask, self_head_mask,
                     cross_head_mask, self.deterministic), None


class EncoderStack(nn.Module):
    """`num_layers` EncoderLayers, and a final LayerNorm if pre-norm."""

    config: StackConfig

    @nn.compact
    def __call__(self, x: Array, mask: Mask, *, head_mask: Array | None = None,
                 layer_mask: Array | None = None, deterministic: bool = True,
                 output_hidden_states: bool = False):
        """Runs the stack.

        Args:
          x: `[batch, length, embed]` embedded inputs.
          mask: an `AttentionMask`, or a `[batch, 1, length, length]` bool mask.
          head_mask: `[layers, heads]` multipliers of attention probabilities.
          layer_mask: `[layers]` bool; False makes that layer the identity.
          output_hidden_states: also return the embeddings and every layer's output.

        Returns:
          `[batch, length, embed]`, and a tuple of `num_layers + 1` hidden states
          `[batch, length, embed]` (or None).
        """
        cfg = self.config
        x = batch_sharded(x)
        hidden_states = [x]
        if cfg.scan_layers:
            scanned = _scan(_EncoderScanBody, cfg.num_layers, 1)(
                cfg, deterministic, output_hidden_states, name=SCANNED_LAYERS)
            x, stacked = scanned(x, (head_mask, layer_mask), mask)
            if output_hidden_states:
                hidden_states.extend(stacked[i] for i in range(cfg.num_layers))
        else:
            for i in range(cfg.num_layers):
                x = _step(_layer(EncoderLayer, cfg, name=f"layer_{i}"), x,
                          _row(layer_mask, i), mask, _row(head_mask, i), deterministic)
                hidden_states.append(x)
        if cfg.norm_position == "pre":
            x = hidden_states[-1] = layer_norm(cfg, "final_norm")(x)
        return x, (tuple(hidden_states) if output_hidden_states else None)


class DecoderStack(nn.Module):
    """`num_layers` DecoderLayers, and a final LayerNorm if pre-norm."""

    config: StackConfig
    num_layers: int
    decode: bool = False

    @nn.compact
    def __call__(self, x: Array, encoded: Array, self_mask: Mask, cross_mask: Mask,
                 *, self_head_mask: Array | None = None,
                 cross_head_mask: Array | None = None, layer_mask: Array | None = None,
                 deterministic: bool = True) -> Array:
        """`[batch, tgt_len, embed]` -> `[batch, tgt_len, embed]`; head masks
        `[layers, heads]`, layer_mask `[layers]` as in EncoderStack."""
        cfg = self.config
        x = batch_sharded(x)
        if cfg.scan_layers:
            scanned = _scan(_DecoderScanBody, self.num_layers, 3)(
                cfg, self.decode, deterministic, name=SCANNED_LAYERS)
            x, _ = scanned(x, (self_head_mask, cross_head_mask, layer_mask), encoded,
                           self_mask, cross_mask)
        else:
            for i in range(self.num_layers):
                layer = _layer(DecoderLayer, cfg, decode=self.decode, name=f"layer_{i}")
                x = _step(layer, x, _row(layer_mask, i), encoded, self_mask, cross_mask,
                          _row(self_head_mask, i), _row(cross_head_mask, i), deterministic)
        if cfg.norm_position == "pre":
            x = layer_norm(cfg, "final_norm")(x)
        return x


def scan_params(params: dict) -> dict:
    """Unscanned -> scanned layout: every dict holding `layer_0`, `layer_1`, ...
    gets them stacked (leading axis) under `layers/layer`: e.g. Hugging Face
    weights (`bert_jax.convert`) for a model with `scan_layers=True`."""
    if not isinstance(params, dict):
        return params
    if "layer_0" not in params:
        return {k: scan_params(v) for k, v in params.items()}
    count = sum(1 for k in params if k.startswith("layer_"))
    layers = [params[f"layer_{i}"] for i in range(count)]
    rest = {k: scan_params(v) for k, v in params.items() if not k.startswith("layer_")}
    return {**rest, SCANNED_LAYERS: {"layer": jax.tree.map(lambda *xs: jnp.stack(xs), *layers)}}


def unscan_params(params: dict) -> dict:
    """Scanned -> unscanned layout, the inverse of `scan_params`."""
    if not isinstance(params, dict):
        return params
    if SCANNED_LAYERS not in params:
        return {k: unscan_params(v) for k, v in params.items()}
    stacked = params[SCANNED_LAYERS]["layer"]
    count = jax.tree.leaves(stacked)[0].shape[0]
    rest = {k: unscan_params(v) for k, v in params.items() if k != SCANNED_LAYERS}
    return {**rest, **{f"layer_{i}": jax.tree.map(lambda x, i=i: x[i], stacked)
                       for i in range(count)}}
