"""Scaled dot-product attention and multi-head attention.

`MultiHeadAttention` maps queries `[batch, q_len, embed]` and keys/values
`[batch, kv_len, embed]` to `[batch, q_len, embed]`; `layers` builds the self-
and cross-attention of every encoder and decoder layer from it.

Conventions:
  * a mask is an `AttentionMask` or a dense boolean array (masks.py);
  * projected queries/keys/values are `[batch, length, heads, head_dim]`;
  * attention probabilities are `[batch, heads, q_length, kv_length]`.

Scores are `Q Kᵀ / √head_dim` accumulated and soft-maxed in float32 whatever the
compute dtype. Masked scores are replaced (not added to) by the most negative
float32, so a row with no visible key (a padding query) gives uniform weights
rather than NaN. Below float32 (bfloat16, float16 compute), and with
`recompute_probabilities` (`config.remat='attention'`), einsum and xla
attention run `lean_attention`: the same forward pass, a backward pass that
keeps the probabilities in the compute dtype, or none at all.
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from bert_jax.modeling import dropout, fused_attention, lean_attention, precision
from bert_jax.modeling.initializers import Initializer, partitioned
from bert_jax.modeling.masks import Mask, causal_mask, combine_masks, dense_mask

Array = jax.Array


def dot_product_attention(
    query: Array,
    key: Array,
    value: Array,
    mask: Mask = None,
    *,
    head_mask: Array | None = None,
    dropout_rate: float = 0.0,
    dropout_rng: Array | None = None,
    deterministic: bool = True,
    impl: str = "einsum",
    return_weights: bool = False,
    recompute_probabilities: bool = False,
) -> tuple[Array, Array | None]:
    """softmax(Q Kᵀ / √d) V over `[batch, length, heads, head_dim]` inputs.

    Args:
      query: `[batch, q_len, heads, head_dim]`.
      key, value: `[batch, kv_len, heads, head_dim]`.
      mask: an `AttentionMask`, or a bool array broadcastable to `[batch, heads,
        q_len, kv_len]` (einsum and xla only).
      head_mask: `[heads]`, multiplies each head's attention probabilities
        (0 removes a head; differentiable, for head-importance scores).
      dropout_rate, dropout_rng, deterministic: attention-probability dropout
        (einsum only).
      impl: 'einsum', or a fused kernel: 'xla', 'cudnn', 'splash', 'flash'
        (see `bert_jax.modeling.fused_attention`).
      return_weights: also return the probabilities (computed with einsum,
        whatever `impl` says: no kernel exposes them).
      recompute_probabilities: einsum and xla save no probabilities for the
        backward pass (`lean_attention`, recompute=True).

    Returns:
      `[batch, q_len, heads, head_dim]` outputs, and `[batch, heads, q_len,
      kv_len]` float32 probabilities (after head mask and dropout) or None.
    """
    depth = query.shape[-1]
    use_dropout = not deterministic and dropout_rate > 0.0
    if impl != "einsum" and use_dropout:
        raise ValueError(
            f"config.model.attention_dropout_rate={dropout_rate}: attention_impl={impl!r} "
            "applies no attention dropout; set it to 0, or attention_impl='einsum'.")
    impl = fused_attention.resolve(impl)
    lean = impl in ("einsum", "xla") and (value.dtype != jnp.float32
                                          or recompute_probabilities)
    if lean and not return_weights:
        out = lean_attention.attention(
            query, key, value, dense_mask(mask, query.shape[1], key.shape[1]),
            dropout_rate=dropout_rate if use_dropout else 0.0, dropout_rng=dropout_rng,
            recompute=recompute_probabilities)
        return _scale_heads(out, head_mask), None
    if impl != "einsum" and not return_weights:
        out = fused_attention.attend(query, key, value, mask,
                                     scale=1.0 / math.sqrt(depth), impl=impl)
        return _scale_heads(out, head_mask), None

    scores = lean_attention.scores(query, key,
                                   dense_mask(mask, query.shape[1], key.shape[1]))
    weights = jax.nn.softmax(scores, axis=-1)
    if head_mask is not None:
        weights = weights * head_mask.astype(jnp.float32)[None, :, None, None]
    if use_dropout:
        if dropout_rng is None:
            raise ValueError("attention dropout needs a dropout_rng.")
        keep = dropout.keep_mask(dropout_rng, dropout_rate, weights.shape)
        weights = dropout.dropped(weights, keep, dropout_rate)
    out = precision.einsum("bhqk,bkhd->bqhd", weights.astype(value.dtype), value)
    return out, (weights if return_weights else None)


def _scale_heads(out: Array, head_mask: Array | None) -> Array:
    """`[batch, q_len, heads, head_dim]` outputs times `head_mask` `[heads]`:
    scaling a head's probabilities scales its output by the same factor."""
    if head_mask is None:
        return out
    return out * head_mask.astype(out.dtype)[None, None, :, None]


class MultiHeadAttention(nn.Module):
    """Multi-head attention for self- and cross-attention.

    Parameters: `query`, `key`, `value` kernels `[embed, heads, kv]` and an
    output projection `out` `[heads, kv, embed]`, each with a bias.

    With `decode=True` (self-attention only) the module keeps a key/value
    cache (collection `cache`) for incremental decoding: `init` with inputs of
    the full target length sizes it, then feed one position at a time.
    Overflowing the cache makes the outputs NaN rather than silently wrong (the
    overflow is a traced value and cannot raise).

    Attention probabilities are sown as `intermediates/attention_weights` when
    that collection is mutable; no fused kernel exposes them, so such calls use
    the einsum path, as does incremental decoding (a flash kernel has nothing
    to tile in a single query).
    """

    num_heads: int
    head_dim: int
    out_features: int
    dropout_rate: float = 0.0
    kernel_init: Initializer = nn.initializers.xavier_uniform()
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    attention_impl: str = "einsum"
    decode: bool = False
    recompute_probabilities: bool = False   # see dot_product_attention

    @nn.compact
    def __call__(
        self,
        inputs_q: Array,
        inputs_kv: Array,
        mask: Mask = None,
        *,
        head_mask: Array | None = None,
        deterministic: bool = True,
    ) -> Array:
        """`[batch, q_len, embed]`, `[batch, kv_len, embed]` -> `[batch, q_len, embed]`."""
        dense = functools.partial(nn.DenseGeneral, dtype=self.dtype,
                                  param_dtype=self.param_dtype,
                                  dot_general=precision.float32_accumulation)
        projection = functools.partial(
            dense, features=(self.num_heads, self.head_dim), axis=-1,
            kernel_init=partitioned(self.kernel_init, ("embed", "heads", "kv")),
            bias_init=partitioned(nn.initializers.zeros, ("heads", "kv")))
        query = projection(name="query")(inputs_q)
        key = projection(name="key")(inputs_kv)
        value = projection(name="value")(inputs_kv)

        overflow = None
        impl = self.attention_impl
        if self.decode:
            key, value, cache_mask, overflow = self._update_cache(key, value)
            mask = combine_masks(dense_mask(mask, query.shape[1], key.shape[1]),
                                 cache_mask)
            impl = "einsum"

        dropout_rng = None
        if not deterministic and self.dropout_rate > 0.0:
            dropout_rng = self.make_rng("dropout")
        out, weights = dot_product_attention(
            query, key, value, mask, head_mask=head_mask, dropout_rate=self.dropout_rate,
            dropout_rng=dropout_rng, deterministic=deterministic, impl=impl,
            return_weights=self.is_mutable_collection("intermediates"),
            recompute_probabilities=self.recompute_probabilities)
        if weights is not None:
            self.sow("intermediates", "attention_weights", weights)
        if overflow is not None:
            out = jnp.where(overflow, jnp.nan, out)
        return dense(
            features=self.out_features, axis=(-2, -1),
            kernel_init=partitioned(self.kernel_init, ("heads", "kv", "embed")),
            bias_init=partitioned(nn.initializers.zeros, ("embed",)), name="out")(out)

    def _update_cache(self, key: Array, value: Array):
        """Writes `[batch, steps, heads, head_dim]` keys/values at the cache index.

        Returns the full cached keys and values `[batch, max_len, heads, head_dim]`,
        a mask `[1, 1, steps, max_len]` hiding positions not yet written, and
        whether this call overflows the cache (a traced bool).
        """
        initialized = self.has_variable("cache", "cached_key")
        if not initialized and not self.is_initializing():
            raise ValueError(f"{self.path}: decode=True needs the 'cache' collection of "
                             "an `init` with a full-length target (mutable=['cache']).")
        cached_key = self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)
        cached_value = self.variable("cache", "cached_value", jnp.zeros, value.shape,
                                     value.dtype)
        cache_index = self.variable("cache", "cache_index",
                                    lambda: jnp.array(0, dtype=jnp.int32))
        if not initialized:  # `init` call: shapes only, full-length causal mask.
            return key, value, causal_mask(key.shape[1]), None
        steps, max_len = key.shape[1], cached_key.value.shape[1]
        index = cache_index.value
        cached_key.value = lax.dynamic_update_slice(cached_key.value, key, (0, index, 0, 0))
        cached_value.value = lax.dynamic_update_slice(cached_value.value, value,
                                                      (0, index, 0, 0))
        cache_index.value = index + steps
        visible = jnp.arange(max_len)[None, :] <= (index + jnp.arange(steps))[:, None]
        return cached_key.value, cached_value.value, visible[None, None], index + steps > max_len
