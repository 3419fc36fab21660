"""The sharded train state and the one jit-compiled train step.

A task supplies `loss_fn(params, batch, rng) -> (loss_sum, weight_sum, sums)`:
the summed loss over real (non-padding) targets, their count, and any other
summed metrics. The step divides by the total weight only after summing over
the whole batch (and over gradient-accumulation micro-batches), so padding
never counts and accumulation equals one large batch exactly.

Gradient accumulation (`grad_accum_steps` > 1) splits the `[batch, ...]`
arrays into `[grad_accum_steps, batch / grad_accum_steps, ...]` and scans over
the micro-batches. Where the gradients are reduced across devices depends on
the mesh in context (`jax.set_mesh`):
- replicated parameters (only the `data` axis is longer than 1; `fsdp` and
  `tensor`, the axes `RULES` puts parameters on, are 1): the scan runs under
  `jax.shard_map` over the mesh, each device summing its own rows' gradients,
  and one `psum` over the batch axes after the last micro-batch reduces them
  once a step (NVIDIA's `allreduce_post_accumulation`). In the global view XLA
  would all-reduce inside the scan, once per micro-batch, and with
  `scan_layers` inside the layer loop too;
- FSDP (`fsdp` > 1): each micro-batch's gradients are reduce-scattered onto
  their parameter shards inside the scan. That is inherent (a device keeps only
  its shard's sum, which is what saves the memory); the step stays in the
  global view, as with tensor parallelism.
Without accumulation the step is the global one on every mesh: each gradient
is reduced once, where XLA places it (inside the backward layer loop with
`scan_layers`, overlapping the rest of the backward pass).

Randomness: micro-batch `i` draws from `fold_in(rng, i)` (`rng` already folded
with the step). Under `shard_map` a device draws for its own rows only, so its
key also folds in its index along the batch axes: without it every device
would draw the same dropout masks. The masks therefore depend on the number of
data-parallel devices there (not so in the global view, where they are drawn
for the whole micro-batch).

`dropout_prng` chooses the generator of the dropout bits (`config_schema.DROPOUT_PRNGS`,
`jax.random`'s implementations): 'threefry' (JAX's default: the keys above as
they are); 'rbg'/'unsafe_rbg', whose bits come from XLA's `RngBitGenerator`
(the TPU's hardware generator; Philox written out on GPUs and CPUs), as
MaxText (`jax_default_prng_impl='unsafe_rbg'`,
src/maxtext/trainers/pre_train/train.py:1075) and T5X
(`utils.set_hardware_rng_ops`, t5x/utils.py:799) run on TPUs. JAX's own
'philox4x32' is left out: its `mulhi` has no XLA lowering on CPU (JAX 0.10.2).
Each loss call's threefry key seeds a key of that implementation
(`dropout_key`), so folding in steps, micro-batches and devices is unchanged
and a run stays exactly resumable; the masks differ from threefry's ('rbg'
ones also with the XLA version, and, in the global view, with the sharding of
the bits, which XLA partitions efficiently only with
`--xla_tpu_spmd_rng_bit_generator_unsafe=1`: jax.random's docs).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.training import train_state
from jax.sharding import Mesh, PartitionSpec

from bert_jax.modeling.losses import sums_to_means
from bert_jax.training.sharding import (
    BATCH_AXES, RULES, batch_sharding, logical_shardings, replicated)

LossFn = Callable[[Any, dict[str, jax.Array], jax.Array],
                  tuple[jax.Array, jax.Array, dict[str, jax.Array]]]


def dropout_key(rng: jax.Array, dropout_prng: str = "threefry") -> jax.Array:
    """The key dropout draws from: `rng` (a raw threefry key, `uint32[2]`) itself
    for 'threefry', else a typed key of `dropout_prng` seeded by its bits."""
    if dropout_prng == "threefry":
        return rng
    shape = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0, impl=dropout_prng)))
    return jax.random.wrap_key_data(jax.random.bits(rng, shape.shape, jnp.uint32),
                                    impl=dropout_prng)


class TrainState(train_state.TrainState):
    """step, params, opt_state (unboxed arrays), with `apply_fn` and `tx` static."""


def _boxed_state_fn(init_fn: Callable[[jax.Array], Any], apply_fn: Callable,
                    tx: optax.GradientTransformation) -> Callable[[jax.Array], TrainState]:
    def boxed_state(rng):
        params = init_fn(rng)["params"]
        return TrainState.create(apply_fn=apply_fn, params=params, tx=tx)
    return boxed_state


def abstract_like(tree: Any, shardings: Any = None) -> Any:
    """ShapeDtypeStructs of a tree of arrays, with `shardings` (default: their own)."""
    if shardings is None:
        shardings = jax.tree.map(lambda x: x.sharding, tree)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        tree, shardings)


def abstract_train_state(init_fn: Callable[[jax.Array], Any], apply_fn: Callable,
                         tx: optax.GradientTransformation, mesh: Mesh,
                         rules=RULES) -> tuple[TrainState, Any]:
    """(the state as `jax.ShapeDtypeStruct`s with their shardings, the shardings),
    computing nothing: what ahead-of-time compilation lowers the step with."""
    boxed = jax.eval_shape(_boxed_state_fn(init_fn, apply_fn, tx), jax.random.PRNGKey(0))
    shardings = logical_shardings(boxed, mesh, rules)
    return abstract_like(nn.meta.unbox(boxed), shardings), shardings


def create_train_state(init_fn: Callable[[jax.Array], Any], apply_fn: Callable,
                       tx: optax.GradientTransformation, mesh: Mesh, rng: jax.Array,
                       rules=RULES) -> tuple[TrainState, Any]:
    """(state, state_shardings), initialised in its sharded layout: no full copy
    is ever built on one device. `init_fn(rng)`: the model's (boxed) variables."""
    _, shardings = abstract_train_state(init_fn, apply_fn, tx, mesh, rules)
    boxed_state = _boxed_state_fn(init_fn, apply_fn, tx)
    init = jax.jit(lambda r: nn.meta.unbox(boxed_state(r)), out_shardings=shardings)
    with jax.set_mesh(mesh):
        return init(rng), shardings


def _split_micro_batches(batch: dict[str, jax.Array], steps: int) -> dict[str, jax.Array]:
    def split(x):
        if x.shape[0] % steps:
            raise ValueError(f"batch of {x.shape[0]} rows is not divisible into "
                             f"grad_accum_steps={steps} micro-batches.")
        return x.reshape(steps, x.shape[0] // steps, *x.shape[1:])
    return jax.tree.map(split, batch)


def _reduce_after_accumulation(rows: int, grad_accum_steps: int, rules=RULES) -> bool:
    """Whether the step sums each device's gradients over the micro-batches and
    reduces once: accumulation over data-parallel devices with replicated
    parameters (no mesh axis that `rules` maps parameters onto is longer than
    1), micro-batches that split evenly over those devices."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or grad_accum_steps == 1:
        return False
    parameter_axes = {axis for name, axes in rules if name != "batch" and axes
                      for axis in ((axes,) if isinstance(axes, str) else axes)}
    if any(mesh.shape.get(axis, 1) > 1 for axis in parameter_axes):
        return False
    devices = math.prod(mesh.shape.get(axis, 1) for axis in BATCH_AXES)
    micro_rows, rest = divmod(rows, grad_accum_steps)
    return devices > 1 and not rest and micro_rows % devices == 0


def make_train_step(loss_fn: LossFn, grad_accum_steps: int = 1,
                    dropout_prng: str = "threefry") -> Callable:
    """`step(state, batch, rng) -> (state, metrics)`, un-jitted; metrics: loss
    (mean over real targets), weight, grad_norm, and the means of the other sums.
    With `grad_accum_steps` > 1 and replicated parameters, it must be traced with
    the mesh in context (`jax.set_mesh`) to reduce once a step (module docstring).
    `dropout_prng`: the generator of the dropout bits (module docstring; a name of
    `config_schema.DROPOUT_PRNGS`, checked at the command's start)."""

    def gradients(params, batch, rng):
        def summed(p):
            loss_sum, weight, sums = loss_fn(p, batch, dropout_key(rng, dropout_prng))
            return loss_sum, (weight, sums)
        (loss_sum, (weight, sums)), grads = jax.value_and_grad(summed, has_aux=True)(params)
        return grads, loss_sum, weight, sums

    def accumulated(params, micro, rng, device=None):
        """Sums of (grads, loss_sum, weight, sums) over the micro-batches."""
        def accumulate(carry, xs):
            index, micro_batch = xs
            key = jax.random.fold_in(rng, index)
            if device is not None:
                key = jax.random.fold_in(key, device)
            out = gradients(params, micro_batch, key)
            return jax.tree.map(jnp.add, carry, out), None

        zeros = jax.eval_shape(gradients, params, jax.tree.map(lambda x: x[0], micro), rng)
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), zeros)
        totals, _ = jax.lax.scan(accumulate, zeros, (jnp.arange(grad_accum_steps), micro))
        return totals

    def reduced_once(params, micro, rng):
        """Per device: its rows' sums over all micro-batches, then one psum.
        `check_vma=False`: the gradients of the replicated parameters stay each
        device's own (no implicit psum per micro-batch)."""
        def local(params, micro, rng):
            device = jax.lax.axis_index(BATCH_AXES)
            return jax.lax.psum(accumulated(params, micro, rng, device), BATCH_AXES)
        return jax.shard_map(local, in_specs=(PartitionSpec(), PartitionSpec(None, BATCH_AXES),
                                              PartitionSpec()),
                             out_specs=PartitionSpec(), check_vma=False)(params, micro, rng)

    def step(state: TrainState, batch: dict[str, jax.Array], rng: jax.Array):
        rng = jax.random.fold_in(rng, state.step)
        if grad_accum_steps == 1:
            grads, loss_sum, weight, sums = gradients(state.params, batch, rng)
        else:
            micro = _split_micro_batches(batch, grad_accum_steps)
            rows = next(iter(jax.tree.leaves(batch))).shape[0]
            if _reduce_after_accumulation(rows, grad_accum_steps):
                grads, loss_sum, weight, sums = reduced_once(state.params, micro, rng)
            else:
                grads, loss_sum, weight, sums = accumulated(state.params, micro, rng)
        denominator = jnp.maximum(weight, 1e-9)
        grads = jax.tree.map(lambda g: g / denominator, grads)
        metrics = {"loss": loss_sum / denominator, "weight": weight,
                   "grad_norm": optax.tree.norm(grads),
                   **sums_to_means(sums, weight)}
        return state.apply_gradients(grads=grads), metrics

    return step


def jit_train_step(step: Callable, state_shardings: Any, mesh: Mesh) -> Callable:
    """Compiles `step` with explicit shardings; the old state's buffers are donated."""
    return jax.jit(step,
                   in_shardings=(state_shardings, batch_sharding(mesh), replicated(mesh)),
                   out_shardings=(state_shardings, replicated(mesh)),
                   donate_argnums=(0,))
