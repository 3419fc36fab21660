"""Dropout whose keep mask costs a quarter of threefry's random bits: every
model's hidden dropout (`Dropout`, in place of `flax.linen.Dropout`) and the
attention dropout of both attention paths (`keep_mask`, `dropped`).

`jax.random.bernoulli` draws one 32-bit word an element (threefry: one
threefry2x32 hash, about 130 vector operations; issue 50 found these bits the
largest vector cost of a BERT-large step: 213 of the 256 ms of vector time of a
v5e phase-1 step, 82 ms of an A100 phase-2 step). Here each 32-bit word of a
threefry key gives four elements: its four bytes, each compared with a
threshold, as FlashAttention draws its dropout (Dao-AILab/flash-attention,
csrc/flash_attn/flash_api.cpp, `set_params_fprop`: the keep probability as
`p_dropout_in_uint8_t`, compared with random bytes). The `rbg` generators
(`config.train.dropout_prng`), whose words cost about an operation each, give
each element a word and compare its top byte's worth with the same threshold:
unpacking would cost them more than it saves.

The rate is therefore a multiple of 1/256: `effective_rate` rounds it (0.1 ->
26/256 = 0.1016), and the kept values are scaled by `1 / (1 - effective_rate)`,
so dropout stays unbiased. A rate that rounding would move by more than
`BYTE_TOLERANCE` of itself (only rates below 0.1 can be: 0.01 -> 0.0117,
0.06 -> 0.0586) is drawn from 16-bit halves instead (two a word; rounded to a
multiple of 1/65536).

Shapes: any; the mask is drawn along the last axis in groups of the elements a
word holds, so a mask sharded along its leading axes draws its bits where it
lives (threefry: the same mask however it is sharded). The same key gives the
same mask (exact resume), on every platform.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array

BYTE_TOLERANCE = 0.02   # the largest relative change of a rate drawn from bytes


def _threshold(rate: float) -> tuple[int, int]:
    """(bits, threshold): the integers drawn are of 8 bits, or of 16 where rounding
    `rate` to a multiple of 1/256 moves it by more than `BYTE_TOLERANCE`; an
    integer below the threshold (`rate` times 2**bits, below 2**bits) drops."""
    for bits in (8, 16):
        threshold = min(round(rate * (1 << bits)), (1 << bits) - 1)
        if abs(threshold / (1 << bits) - rate) <= BYTE_TOLERANCE * rate:
            break
    return bits, threshold


def effective_rate(rate: float) -> float:
    """The rate `keep_mask` drops at: `rate` rounded to its bits' resolution."""
    bits, threshold = _threshold(rate)
    return threshold / (1 << bits)


def _hashed(rng: Array) -> bool:
    """Whether `rng` draws its bits by hashing (threefry, a raw key's generator),
    not from a hardware or counter generator (`rbg`, `unsafe_rbg`)."""
    return (not jnp.issubdtype(rng.dtype, jax.dtypes.prng_key)
            or jax.random.key_impl(rng) == "threefry2x32")


def keep_mask(rng: Array, rate: float, shape: tuple[int, ...]) -> Array:
    """Bool `shape`, True with probability `1 - effective_rate(rate)`: random
    integers of 8 (or 16) bits at or above the rate's threshold. A threefry key
    takes several from each 32-bit word (a hash a word); the `rbg` generators,
    whose words cost about an operation each, give each element a word of its
    own, compared with the same threshold in its top bits (the same rate), which
    spares the unpacking."""
    bits, threshold = _threshold(rate)
    if not _hashed(rng):
        return jax.random.bits(rng, shape, jnp.uint32) >= jnp.uint32(threshold << (32 - bits))
    per_word = 32 // bits
    *lead, last = shape
    words = jax.random.bits(rng, (*lead, -(-last // per_word), 1), jnp.uint32)
    shifts = jnp.arange(per_word, dtype=jnp.uint32) * bits   # each part's lowest bit
    parts = (words >> shifts) & ((1 << bits) - 1)            # [..., words, per_word]
    return (parts >= threshold).reshape(*lead, -1)[..., :last]


def dropped(values: Array, keep: Array, rate: float) -> Array:
    """Inverted dropout: `values / (1 - effective_rate(rate))` where `keep`, 0
    elsewhere (the product with the mask, not a `jnp.where` with 0, whose
    broadcast zeros JAX would hoist out of a layer loop, as
    `lean_attention.scores` explains: the same values for finite `values`)."""
    return values / (1.0 - effective_rate(rate)) * keep


class Dropout(nn.Module):
    """`flax.linen.Dropout` with `keep_mask`'s bits: `[...]` in, the same shape
    out; the key from the 'dropout' RNG collection."""

    rate: float

    @nn.compact
    def __call__(self, x: Array, deterministic: bool) -> Array:
        if deterministic or self.rate == 0.0:
            return x
        keep = keep_mask(self.make_rng("dropout"), self.rate, x.shape)
        return dropped(x, keep, self.rate).astype(x.dtype)
