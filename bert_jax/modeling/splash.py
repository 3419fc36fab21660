"""TPU splash attention (Pallas) behind a sharded, BERT-shaped interface.

`splash_attention` runs the Pallas TPU "splash" (sparse flash) kernel of
`jax.experimental.pallas.ops.tpu.splash_attention` per device inside
`jax.shard_map` (the TPU compiler refuses to partition Mosaic kernels itself):
the batch is split over every mesh axis except "tensor" (a leading "dcn"-style
axis included), the heads over "tensor" when it divides the head count (else
replicated), and the multi-head kernel is vmapped over the local examples.
It takes the model's layout, queries `[batch, q_len, heads, head_dim]`, keys
and values `[batch, kv_len, heads, head_dim]` and int segment ids
`[batch, q_len]` and `[batch, kv_len]`, and returns `[batch, q_len, heads,
head_dim]`; `fused_attention.attend` calls it for `attention_impl='splash'`.

Constraints of the installed kernel (jax 0.10.2), checked by the tests:

  * lengths: the key/value blocks (and their compute blocks) must be multiples
    of 128 lanes ("bkv_compute=64 must be a multiple of 128"), and with segment
    ids the backward's query blocks too ("block_q must be a multiple of 128").
    The kernel checks this in Pallas interpret mode as well, so `q_len` and
    `kv_len` must be multiples of 128 in every mode; blocks are the largest of
    (512, 256, 128) dividing each length.
  * head_dim: no multiple-of-128 requirement; 64 (BERT-base) runs in interpret
    mode and compiles for TPU (the kernel slices its 128-lane tiles down to
    head_dim), so no padding is done.
  * cross-attention (`q_len != kv_len`) is supported without `causal`; with
    segment ids, a query sharing no id with any key gets a fully masked row, for
    which the kernel returns the plain mean of the values (no NaN, also in the
    gradients).
  * dtypes: float32 and bfloat16 (scores and softmax statistics in float32; the
    output has the input dtype).
  * backward: `jax.grad` works (custom VJP with separate dq and dkv kernels),
    both compiled for TPU and in interpret mode; higher-order AD is not.
  * the kernel applies no softmax scale, so the query is multiplied by `scale`
    (in float32, cast back to the input dtype) before the call.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_kernel as splash_kernel,
)
from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_mask as splash_mask,
)
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from bert_jax.config_schema import SPLASH_LANES as _LANES

Array = jax.Array

_BLOCK_CANDIDATES = (512, 256, 128)
_TENSOR_AXIS = "tensor"


def splash_attention(
    query: Array,
    key: Array,
    value: Array,
    *,
    query_segments: Array | None = None,
    key_segments: Array | None = None,
    causal: bool = False,
    scale: float,
    mesh: jax.sharding.Mesh,
    interpret: bool = False,
) -> Array:
    """softmax(scale · Q Kᵀ) V with the Pallas TPU splash-attention kernel.

    Args:
      query: `[batch, q_len, heads, head_dim]`.
      key, value: `[batch, kv_len, heads, head_dim]`.
      query_segments, key_segments: `[batch, q_len]`, `[batch, kv_len]` int
        (both or neither). A query attends only to keys with the same id:
        padding is segment 0 vs 1, packed sequences use their ids.
      causal: query i sees keys j <= i (self-attention, `q_len == kv_len`).
      scale: multiplies the scores (e.g. `1 / sqrt(head_dim)`).
      mesh: a mesh with a "tensor" axis; every other axis splits the batch.
      interpret: run the kernel in the Pallas interpreter (CPU tests).

    Returns:
      `[batch, q_len, heads, head_dim]` in the dtype of `query`.
    """
    _check_shapes(query, key, value, query_segments, key_segments, causal)
    batch, q_len, heads, _ = query.shape
    # Inside a `jax.shard_map` manual over the whole mesh (the train step's
    # accumulation over data-parallel devices) the arrays are a device's own.
    local = set(mesh.manual_axes) == set(mesh.axis_names)
    batch_axes, head_axis = ((), None) if local else _mesh_axes(mesh, batch=batch, heads=heads)
    kernel = _make_kernel(heads, q_len, key.shape[1], causal=causal,
                          head_shards=mesh.shape[head_axis] if head_axis else 1,
                          interpret=interpret)
    segment_ids = None
    if query_segments is not None:
        segment_ids = splash_kernel.SegmentIds(query_segments.astype(jnp.int32),
                                               key_segments.astype(jnp.int32))
    query = (query.astype(jnp.float32) * scale).astype(query.dtype)
    if local:
        return _local_attention(kernel, query, key, value, segment_ids)
    qkv_spec = P(batch_axes, None, head_axis, None)
    sharded = jax.shard_map(
        _local_attention,
        mesh=mesh,
        in_specs=(
            kernel.manual_sharding_spec(NamedSharding(mesh, P(head_axis, None))),
            qkv_spec, qkv_spec, qkv_spec,
            P(batch_axes, None),  # both segment id arrays (or None)
        ),
        out_specs=qkv_spec,
        check_vma=False,
    )
    return sharded(kernel, query, key, value, segment_ids)


def _check_shapes(query, key, value, query_segments, key_segments, causal) -> None:
    (batch, q_len, heads, head_dim), kv_len = query.shape, key.shape[1]
    if key.shape != value.shape or key.shape != (batch, kv_len, heads, head_dim):
        raise ValueError(f"query {query.shape}, key {key.shape} and value {value.shape} "
                         "do not match [batch, length, heads, head_dim]")
    if (query_segments is None) != (key_segments is None):
        raise ValueError("give both query_segments and key_segments, or neither")
    if query_segments is not None and (
            query_segments.shape != (batch, q_len) or key_segments.shape != (batch, kv_len)):
        raise ValueError(f"segment ids {query_segments.shape}, {key_segments.shape} do not "
                         f"match [batch, q_len | kv_len] = {(batch, q_len)}, {(batch, kv_len)}")
    if causal and q_len != kv_len:
        raise ValueError(f"causal splash attention needs q_len == kv_len, got {q_len}, {kv_len}")
    if q_len % _LANES or kv_len % _LANES:
        raise ValueError(f"config.model.attention_impl='splash': needs lengths that are "
                         f"multiples of {_LANES} (q_len={q_len}, kv_len={kv_len}); set the "
                         "data's sequence length to one, or use attention_impl='xla'.")


def _mesh_axes(mesh: jax.sharding.Mesh, *, batch: int, heads: int):
    """-> (batch mesh axes, head mesh axis or None) for the shard_map specs."""
    batch_axes = tuple(name for name in mesh.axis_names if name != _TENSOR_AXIS)
    batch_shards = math.prod(mesh.shape[name] for name in batch_axes)
    if batch % batch_shards:
        raise ValueError(f"batch {batch} is not divisible by the {batch_shards} devices of "
                         f"mesh axes {batch_axes}")
    tensor = mesh.shape.get(_TENSOR_AXIS, 1)
    return batch_axes, (_TENSOR_AXIS if tensor > 1 and heads % tensor == 0 else None)


def _make_kernel(
    heads: int, q_len: int, kv_len: int, *, causal: bool, head_shards: int, interpret: bool
) -> splash_kernel.SplashAttentionKernel:
    """The multi-head splash kernel for one example: `[heads, length, head_dim]` in/out.

    Its mask-info arrays are split over `head_shards` head groups, to be passed
    through `shard_map` with `manual_sharding_spec`. Built outside `shard_map`
    (the mask processing is numpy; arrays made inside the body would be traced).
    """
    shape = (q_len, kv_len)
    mask = splash_mask.CausalMask(shape) if causal else splash_mask.FullMask(shape)
    # The largest of (512, 256, 128) dividing each length (a multiple of 128).
    bq, bkv = (next(b for b in _BLOCK_CANDIDATES if n % b == 0) for n in shape)
    block_sizes = splash_kernel.BlockSizes(
        block_q=bq, block_kv=bkv, block_kv_compute=bkv,
        block_q_dkv=bq, block_kv_dkv=bkv, block_kv_dkv_compute=bkv,
        block_q_dq=bq, block_kv_dq=bkv)
    return splash_kernel.make_splash_mha(
        splash_mask.MultiHeadMask((mask,) * heads), block_sizes=block_sizes,
        head_shards=head_shards, q_seq_shards=1, interpret=interpret)


def _local_attention(kernel, query, key, value, segment_ids):
    """Per-device body: `[local_batch, length, local_heads, head_dim]` in and out.

    `segment_ids` is None or `SegmentIds` of `[local_batch, length]` arrays; the
    kernel runs on `[local_heads, length, head_dim]` and is vmapped over examples.
    """
    to_heads_first = functools.partial(jnp.swapaxes, axis1=1, axis2=2)
    out = jax.vmap(kernel)(to_heads_first(query), to_heads_first(key),
                           to_heads_first(value), segment_ids)
    return to_heads_first(out)
