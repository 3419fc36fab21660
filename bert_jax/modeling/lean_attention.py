"""softmax(Q Kᵀ / √d) V with a hand-written backward pass that keeps no float32
`[batch, heads, q_len, kv_len]` tensor for it: the einsum and xla attention of
a bfloat16 (or float16) model, and of any model with `config.remat='attention'`.

Queries `[batch, q_len, heads, head_dim]` and keys and values `[batch, kv_len,
heads, head_dim]` go in, `[batch, q_len, heads, head_dim]` comes out, in the
values' dtype. The forward pass is `attention.dot_product_attention`'s, operation
for operation: scores accumulated in float32 and soft-maxed with float32 max and
sum statistics (`jax.nn.softmax` of the float32 scores), the same dropout mask
from the same key, the dropped probabilities rounded once to the compute dtype
for the matmul with the values. Only what the backward pass keeps changes: the
probabilities rounded to the compute dtype (it recomputes the dropped ones from
them), not in float32.

Why a custom VJP. Differentiated by JAX, that path saves for the backward pass
the float32 softmax output (`jax.nn.softmax`'s derivative is written in it), the
dropout mask and the dropped bfloat16 probabilities: 7 bytes per score; under
`nn.scan` each is stacked per layer, written into a `[layers, ...]` buffer in the
forward pass and sliced back out in the backward pass (issue 50: 39.5% of the
bytes of BERT-large's phase-2 GPU step touch float32 `[..., 512, 512]`
tensors). The backward pass needs no more than the probabilities in the compute
dtype and the mask (3 bytes a score), or nothing at all if it recomputes them.
Its algebra is FlashAttention's backward pass (Dao et al. 2022, arXiv
2205.14135, Appendix B.2 and Algorithm 4, dropout included):

    dV = Wᵀ dO                      W: the dropped probabilities, compute dtype
    dW = dO Vᵀ                      float32 accumulation
    dP = Z ∘ dW / (1 - rate)        Z: the dropout keep mask
    D  = rowsum(dO ∘ O)             = rowsum(P ∘ dP): one number per query row
                                      from `[q_len, head_dim]` arrays, not a pass
                                      over the scores (Dao-AILab/flash-attention:
                                      its backward "preprocess" kernel, dPsum)
    dS = P ∘ (dP - D) / √d          float32, then rounded to the compute dtype for
    dQ = dS K,  dK = dSᵀ Q          the two matmuls, as the kernels feed dS to
                                      their dQ and dK matmuls in 16 bits

Masked scores get no gradient (the forward pass replaces them, `jnp.where`).
With `recompute=True` (`config.remat='attention'`) the backward pass saves only
its inputs (queries, keys, values, the mask and the dropout key) and recomputes
the scores, the probabilities and the dropout mask, as FlashAttention does
(Section 3.1, "Recomputation"), at the cost of the Q Kᵀ matmul, the softmax and
the dropout's random bits again.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from bert_jax.modeling import precision
from bert_jax.modeling.dropout import dropped, keep_mask

Array = jax.Array


def scores(query: Array, key: Array, mask: Array | None) -> Array:
    """Float32 `Q Kᵀ / √head_dim`, `[batch, heads, q_len, kv_len]`; masked
    entries (mask False) replaced by the most negative float32. `mask`: bool,
    broadcastable to the scores.

    The mask and the fill pass through an optimization barrier with the
    queries. Under `nn.scan` the mask is a constant of the layer loop, and JAX
    computes whatever depends on the loop's constants alone once, before the
    loop (`lax.scan`'s partial evaluation, `_scan_known_hoisting`): here the
    mask and the fill broadcast to the scores' shape, which each layer then
    reads (for BERT-large at 512, 32 rows: 640 MiB a layer and micro-batch,
    and as much memory held). Tied to the queries they stay in the layer,
    where XLA fuses the broadcasts into the matmul's epilogue."""
    if mask is not None:
        mask, fill, query = jax.lax.optimization_barrier(
            (mask, jnp.float32(jnp.finfo(jnp.float32).min), query))
    out = jnp.einsum("bqhd,bkhd->bhqk", query, key, preferred_element_type=jnp.float32)
    out = out / jnp.sqrt(jnp.float32(query.shape[-1]))
    if mask is not None:
        out = jnp.where(mask, out, fill)
    return out


def _probabilities(query: Array, key: Array, mask: Array | None, rng: Array | None,
                   rate: float) -> tuple[Array, Array | None]:
    """Float32 softmax probabilities and the keep mask (None without dropout),
    both `[batch, heads, q_len, kv_len]`."""
    probabilities = jax.nn.softmax(scores(query, key, mask), axis=-1)
    keep = None if rate == 0.0 else keep_mask(rng, rate, probabilities.shape)
    return probabilities, keep


def _dropped(probabilities: Array, keep: Array | None, rate: float, dtype) -> Array:
    """Dropout applied to `probabilities` (rescaled in float32), in `dtype`."""
    probabilities = probabilities.astype(jnp.float32)
    if keep is not None:
        probabilities = dropped(probabilities, keep, rate)
    return probabilities.astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _attention(query, key, value, mask, rng, rate, recompute):
    return _attention_fwd(query, key, value, mask, rng, rate, recompute)[0]


def _attention_fwd(query, key, value, mask, rng, rate, recompute):
    probabilities, keep = _probabilities(query, key, mask, rng, rate)
    out = precision.einsum("bhqk,bkhd->bqhd",
                           _dropped(probabilities, keep, rate, value.dtype), value)
    kept = None if recompute else (probabilities.astype(value.dtype), keep)
    return out, (query, key, value, mask, rng, out, kept)


def _attention_bwd(rate, recompute, residuals, d_out):
    query, key, value, mask, rng, out, kept = residuals
    probabilities, keep = (_probabilities(query, key, mask, rng, rate)
                           if recompute else kept)
    d_value = precision.einsum("bhqk,bqhd->bkhd",
                               _dropped(probabilities, keep, rate, value.dtype), d_out)
    d_probabilities = jnp.einsum("bqhd,bkhd->bhqk", d_out, value,
                                 preferred_element_type=jnp.float32)
    if keep is not None:
        d_probabilities = dropped(d_probabilities, keep, rate)
    row = jnp.einsum("bqhd,bqhd->bhq", d_out.astype(jnp.float32),
                     out.astype(jnp.float32))[..., None]
    d_scores = (probabilities.astype(jnp.float32) * (d_probabilities - row)
                / jnp.sqrt(jnp.float32(query.shape[-1])))
    if mask is not None:
        d_scores = jnp.where(mask, d_scores, 0.0)
    d_scores = d_scores.astype(query.dtype)
    d_query = precision.einsum("bhqk,bkhd->bqhd", d_scores, key)
    d_key = precision.einsum("bhqk,bqhd->bkhd", d_scores, query)
    return d_query, d_key, d_value, None, None


_attention.defvjp(_attention_fwd, _attention_bwd)


def attention(query: Array, key: Array, value: Array, mask: Array | None = None, *,
              dropout_rate: float = 0.0, dropout_rng: Array | None = None,
              recompute: bool = False) -> Array:
    """softmax(Q Kᵀ / √d) V, `[batch, q_len, heads, head_dim]` in the values'
    dtype, with the lean backward pass of the module docstring.

    Args:
      query: `[batch, q_len, heads, head_dim]`.
      key, value: `[batch, kv_len, heads, head_dim]`.
      mask: bool, broadcastable to `[batch, heads, q_len, kv_len]`, or None.
      dropout_rate, dropout_rng: attention dropout (0: none; the key then unused).
      recompute: save no probabilities or mask for the backward pass; recompute
        them there from the queries, keys and dropout key.
    """
    rate = float(dropout_rate)
    if rate and dropout_rng is None:
        raise ValueError("attention dropout needs a dropout_rng.")
    return _attention(query, key, value, mask, dropout_rng if rate else None, rate,
                      bool(recompute))
