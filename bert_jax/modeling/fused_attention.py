"""Fused attention kernels behind one name per kernel, chosen per platform.

`MultiHeadAttention` (attention.py) calls `attend` when `config.attention_impl`
is not 'einsum': queries `[batch, q_len, heads, head_dim]` and keys and values
`[batch, kv_len, heads, head_dim]` go in, the attended values
`[batch, q_len, heads, head_dim]` come out, in the inputs' dtype.

`config.attention_impl` says which computation runs:
  einsum  explicit scores and probabilities (dropout, attention maps); any mask.
  xla     `jax.nn.dot_product_attention(implementation='xla')`: XLA's own
          attention, on every platform; any mask.
  cudnn   cuDNN flash attention (GPU): padding as sequence lengths, causality
          as `is_causal`; bfloat16/float16 only, head_dim <= 128 (256 on
          Hopper and later), a multiple of 8. Packed segments are refused:
          `jax.nn.dot_product_attention` takes no segment ids (cuDNN's packed
          layout is reachable only through JAX's private cudnn module).
  splash  Pallas splash attention (TPU), under `jax.shard_map` over the mesh:
          padding and packed sequences as segment ids, causality as a mask
          (`bert_jax.modeling.splash`).
  flash   the platform's flash kernel: cudnn on GPU, splash on TPU, xla on CPU.

The platform is the one the step is compiled for: that of the mesh in context
(`jax.set_mesh`, as the train loop and `launch/compile.py` use), otherwise JAX's
default backend. What a kernel cannot run (a dtype, packed rows, lengths,
attention dropout, 'flash' without a kernel) is a rule of the config
(`bert_jax.config_schema`'s `_attention`), refused before the model is built;
a direct call that breaks it raises (packed rows, lengths, attention dropout:
`ValueError`; a dense mask, which only code passes: `TypeError`; a dtype: JAX's
cuDNN); nothing falls back silently. The kernels apply no attention dropout.
cuDNN has its own (JAX's private
`fused_attention_stablehlo.dot_product_attention(dropout_rate=)`), but its seed
is a compile-time constant and XLA's runtime advances the offset per thunk in
host memory: the backward's mask is the forward's only while the two run equally
often (not with scanned layers), every device draws the same masks, and a
resumed run draws other ones (docs/ACCELERATORS.md, "Why not cuDNN's own
attention dropout").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bert_jax.config_schema import ATTENTION_IMPLS, FLASH_KERNELS, choice, platform
from bert_jax.modeling.masks import AttentionMask, Mask, dense_mask

Array = jax.Array


def resolve(impl: str) -> str:
    """`impl` with 'flash' replaced by the platform's kernel."""
    if choice("config.model.attention_impl", impl, ATTENTION_IMPLS) != "flash":
        return impl
    return FLASH_KERNELS[platform()]  # a platform without one: config_schema refuses it


def attend(query: Array, key: Array, value: Array, mask: Mask, *, scale: float,
           impl: str) -> Array:
    """softmax(scale Q Kᵀ) V with a fused kernel ('xla', 'cudnn' or 'splash').

    query `[batch, q_len, heads, head_dim]`, key/value `[batch, kv_len, heads,
    head_dim]` -> `[batch, q_len, heads, head_dim]`.
    """
    if impl == "xla":
        return jax.nn.dot_product_attention(
            query, key, value, mask=dense_mask(mask, query.shape[1], key.shape[1]),
            scale=scale, implementation="xla")
    if mask is None:
        mask = AttentionMask()
    elif not isinstance(mask, AttentionMask):
        raise TypeError(
            f"config.model.attention_impl={impl!r} takes an AttentionMask (masks.py), not "
            "a dense boolean mask; or use 'xla' or 'einsum'.")
    if impl == "cudnn":  # JAX refuses other dtypes than bfloat16/float16 itself
        return length_masked_attention(query, key, value, mask, scale=scale,
                                       implementation="cudnn")
    if impl == "splash":
        from bert_jax.modeling import splash  # Pallas TPU modules load on demand
        query_segments, key_segments = splash_segments(mask, query, key)
        return splash.splash_attention(
            query, key, value, query_segments=query_segments, key_segments=key_segments,
            causal=mask.causal, scale=scale, mesh=jax.sharding.get_abstract_mesh(),
            interpret=platform() != "tpu")
    raise ValueError(f"attend: {impl!r} is not a fused kernel.")


def length_masked_attention(query: Array, key: Array, value: Array,
                            mask: AttentionMask, *, scale: float,
                            implementation: str) -> Array:
    """`jax.nn.dot_product_attention` with padding given as sequence lengths and
    causality as `is_causal`: the form cuDNN takes. With implementation='xla'
    it runs anywhere, which is how the mapping is tested on CPU."""
    if mask.query_segments is not None:
        raise ValueError(
            "config.model.attention_impl='cudnn' (or 'flash' on GPU) takes no packed "
            "segments: set config.data.pack_length=0, or attention_impl 'xla' or 'einsum'.")

    def lengths(valid):  # [batch, length] bool, valid tokens first -> [batch] int32
        return None if valid is None else jnp.sum(valid, axis=-1, dtype=jnp.int32)

    return jax.nn.dot_product_attention(
        query, key, value, scale=scale, is_causal=mask.causal,
        query_seq_lengths=lengths(mask.query_valid),
        key_value_seq_lengths=lengths(mask.key_valid), implementation=implementation)


def splash_segments(mask: AttentionMask, query: Array, key: Array
                    ) -> tuple[Array | None, Array | None]:
    """Padding and packing as splash's segment ids `[batch, q_len]`, `[batch,
    kv_len]`: a query sees the keys of its own id. Packed rows keep their ids,
    padding keys get 0; without packing valid keys are 1, padding keys 0 and
    every query 1 (a padding query's output is never read, and no row is left
    without a visible key)."""
    if mask.query_segments is None and mask.key_valid is None:
        return None, None
    batch = query.shape[0]
    if mask.query_segments is not None:
        query_segments, key_segments = mask.query_segments, mask.key_segments
    else:
        query_segments = jnp.ones((batch, query.shape[1]), jnp.int32)
        key_segments = jnp.ones((batch, key.shape[1]), jnp.int32)
    if mask.key_valid is not None:
        key_segments = jnp.where(mask.key_valid, key_segments, 0)
    return query_segments.astype(jnp.int32), key_segments.astype(jnp.int32)
