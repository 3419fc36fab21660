"""Attention masks: dense boolean arrays and the structured `AttentionMask`.

A dense mask is True where a query may attend to a key, `[batch, 1 | heads,
q_length, kv_length]` (broadcastable). `AttentionMask` keeps padding, packed
segments and causality apart, the form fused kernels take (cuDNN reads
sequence lengths, splash reads segment ids), and gives the dense mask on demand.
"""

from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp

Array = jax.Array


def padding_mask(query_valid: Array, key_valid: Array) -> Array:
    """`[batch, q_len]`, `[batch, kv_len]` bool -> `[batch, 1, q_len, kv_len]`."""
    return query_valid[:, None, :, None] & key_valid[:, None, None, :]


def causal_mask(length: int) -> Array:
    """Look-ahead mask: query i sees keys j <= i. -> `[1, 1, length, length]`."""
    idx = jnp.arange(length)
    return (idx[None, :] <= idx[:, None])[None, None]


def segment_mask(query_segments: Array, key_segments: Array) -> Array:
    """Packed sequences: attend only within the same segment id.

    `[batch, q_len]`, `[batch, kv_len]` int -> `[batch, 1, q_len, kv_len]`.
    """
    return query_segments[:, None, :, None] == key_segments[:, None, None, :]


def combine_masks(*masks: Array | None) -> Array | None:
    """Logical AND of broadcastable masks; `None` entries are ignored."""
    present = [m for m in masks if m is not None]
    if not present:
        return None
    return functools.reduce(jnp.logical_and, present)


@flax.struct.dataclass
class AttentionMask:
    """Which keys each query may see, in the structured form fused kernels take.

    A query at position i of row b sees key j when every given part allows it:
      query_valid `[batch, q_len]` bool: False hides the query's whole row
        (einsum then gives it uniform weights; kernels may give zeros: the
        outputs at invalid queries are not meant to be read);
      key_valid `[batch, kv_len]` bool: False hides the key (padding);
      query_segments, key_segments `[batch, q_len | kv_len]` int: packed
        sequences, a query sees only keys of its own segment id;
      causal (static): j <= i (self-attention).
    Padding is right padding wherever a kernel reads lengths (cuDNN): the
    valid tokens of a row come first, as every bert_jax pipeline writes them.
    """

    query_valid: Array | None = None
    key_valid: Array | None = None
    query_segments: Array | None = None
    key_segments: Array | None = None
    causal: bool = flax.struct.field(pytree_node=False, default=False)

    def dense(self, q_len: int, kv_len: int) -> Array | None:
        """The boolean mask `[batch | 1, 1, q_len, kv_len]`, or None if empty."""
        batch = next((part.shape[0] for part in (self.query_valid, self.key_valid,
                                                 self.query_segments)
                      if part is not None), 1)
        padding = None
        if self.query_valid is not None or self.key_valid is not None:
            ones = jnp.ones((batch, max(q_len, kv_len)), bool)
            padding = padding_mask(
                ones[:, :q_len] if self.query_valid is None else self.query_valid,
                ones[:, :kv_len] if self.key_valid is None else self.key_valid)
        segments = None
        if self.query_segments is not None:
            segments = segment_mask(self.query_segments, self.key_segments)
        return combine_masks(padding, segments,
                             causal_mask(q_len) if self.causal else None)


Mask = AttentionMask | Array | None


def dense_mask(mask: Mask, q_len: int, kv_len: int) -> Array | None:
    """A mask of either form -> the boolean `[batch | 1, 1, q_len, kv_len]` array."""
    return mask.dense(q_len, kv_len) if isinstance(mask, AttentionMask) else mask
