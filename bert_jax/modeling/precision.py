"""Matrix multiplications that accumulate in float32 whatever the compute dtype.

With `dtype='bfloat16'` a plain `lax.dot_general` of bfloat16 operands returns
bfloat16, and XLA:CPU runs it as a float32 matmul between conversions
(measured on an AVX512-BF16 CPU: 370 GFLOP/s, below float32's 409). Asking
for a float32 result selects the native bfloat16 kernel (744 GFLOP/s on the
same CPU), and float32 accumulation is what mixed precision wants on every
backend. Results are cast back to the operands' dtype, so modules see the
dtype they asked for.

Autodiff alone would undo this in the backward pass (the transposed matmuls
would mix a float32 cotangent with bfloat16 operands and run in float32), so
the dense-layer contraction has its own VJP whose two matmuls are bfloat16
with float32 accumulation as well. Float32 operands take the plain path.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax


def _dot(a: jax.Array, b: jax.Array, contract_a, contract_b, dtype) -> jax.Array:
    out = lax.dot_general(a, b, ((tuple(contract_a), tuple(contract_b)), ((), ())),
                          preferred_element_type=jnp.float32)
    return out.astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def contract(lhs: jax.Array, rhs: jax.Array, num_contract: int) -> jax.Array:
    """`lhs [*free, *K] x rhs [*K, *out] -> [*free, *out]` over the `num_contract`
    trailing axes of `lhs` and leading axes of `rhs` (a dense layer), float32
    accumulation in the forward and backward matmuls."""
    return _dot(lhs, rhs, range(lhs.ndim - num_contract, lhs.ndim), range(num_contract),
                jnp.result_type(lhs, rhs))


def _contract_fwd(lhs, rhs, num_contract):
    return contract(lhs, rhs, num_contract), (lhs, rhs)


def _contract_bwd(num_contract, residuals, cotangent):
    lhs, rhs = residuals
    free = lhs.ndim - num_contract   # leading axes of lhs (and of the output)
    outs = rhs.ndim - num_contract   # trailing axes of rhs (and of the output)
    d_lhs = _dot(cotangent, rhs, range(free, free + outs), range(num_contract, rhs.ndim),
                 lhs.dtype)
    d_rhs = _dot(lhs, cotangent, range(free), range(free), rhs.dtype)
    return d_lhs, d_rhs


contract.defvjp(_contract_fwd, _contract_bwd)


def _is_dense_contraction(lhs, rhs, dimension_numbers) -> int:
    """The number of contracted axes if `dimension_numbers` contract trailing
    lhs axes with leading rhs axes in order and have no batch axes, else 0."""
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
    count = len(lhs_contract)
    if lhs_batch or rhs_batch or not count:
        return 0
    if (tuple(a % lhs.ndim for a in lhs_contract) != tuple(range(lhs.ndim - count, lhs.ndim))
            or tuple(a % rhs.ndim for a in rhs_contract) != tuple(range(count))):
        return 0
    return count


def float32_accumulation(lhs: jax.Array, rhs: jax.Array, dimension_numbers,
                         precision=None, preferred_element_type=None,
                         **kwargs) -> jax.Array:
    """Drop-in for the `dot_general` argument of `nn.Dense`/`nn.DenseGeneral`:
    float32 accumulation, result (and gradients) in the operands' dtype."""
    del preferred_element_type  # always float32 inside
    dtype = jnp.result_type(lhs, rhs)
    count = _is_dense_contraction(lhs, rhs, dimension_numbers)
    if dtype != jnp.float32 and count and precision is None and not kwargs:
        return contract(lhs, rhs, count)
    out = lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                          preferred_element_type=jnp.float32, **kwargs)
    return out.astype(dtype)


def einsum(subscripts: str, *operands: jax.Array) -> jax.Array:
    """`jnp.einsum` with a float32 accumulator, cast to the operands' dtype."""
    out = jnp.einsum(subscripts, *operands, preferred_element_type=jnp.float32)
    return out.astype(jnp.result_type(*operands))
