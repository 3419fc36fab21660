"""The sharded train state and the one jit-compiled train step.

A task supplies `loss_fn(params, batch, rng) -> (loss_sum, weight_sum, sums)`:
the summed loss over real (non-padding) targets, their count, and any other
summed metrics. The step divides by the total weight only after summing over
the whole batch (and over gradient-accumulation micro-batches), so padding
never counts and accumulation equals one large batch exactly.
"""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.training import train_state
from jax.sharding import Mesh

from bert_jax.modeling.losses import sums_to_means
from bert_jax.training.sharding import RULES, batch_sharding, logical_shardings, replicated

LossFn = Callable[[Any, dict[str, jax.Array], jax.Array],
                  tuple[jax.Array, jax.Array, dict[str, jax.Array]]]


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


def make_train_step(loss_fn: LossFn, grad_accum_steps: int = 1) -> Callable:
    """`step(state, batch, rng) -> (state, metrics)`, un-jitted; metrics: loss
    (mean over real targets), weight, grad_norm, and the means of the other sums."""
    def gradients(params, batch, rng):
        def summed(p):
            loss_sum, weight, sums = loss_fn(p, batch, rng)
            return loss_sum, (weight, sums)
        (loss_sum, (weight, sums)), grads = jax.value_and_grad(summed, has_aux=True)(params)
        return grads, loss_sum, weight, sums

    def step(state: TrainState, batch: dict[str, jax.Array], rng: jax.Array):
        rng = jax.random.fold_in(rng, state.step)
        if grad_accum_steps == 1:
            grads, loss_sum, weight, sums = gradients(state.params, batch, rng)
        else:
            micro = _split_micro_batches(batch, grad_accum_steps)

            def accumulate(carry, xs):
                index, micro_batch = xs
                out = gradients(state.params, micro_batch, jax.random.fold_in(rng, index))
                return jax.tree.map(jnp.add, carry, out), None

            zeros = jax.eval_shape(gradients, state.params,
                                   jax.tree.map(lambda x: x[0], micro), rng)
            zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), zeros)
            (grads, loss_sum, weight, sums), _ = jax.lax.scan(
                accumulate, zeros, (jnp.arange(grad_accum_steps), micro))
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
