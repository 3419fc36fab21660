"""Evaluation over a task's eval split, during training or from a checkpoint."""

from __future__ import annotations

import os
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bert_jax.tasks import Task, build_task
from bert_jax.training.losses import sums_to_means
from bert_jax.training.checkpoints import CHECKPOINT_DIR, CheckpointError, restore_params
from bert_jax.training.sharding import (
    global_batch, logical_shardings, mesh_from_config, replicated)


def abstract_like(tree: Any) -> Any:
    """ShapeDtypeStructs (with shardings) of a tree of arrays."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def jit_eval_step(task: Task, mesh) -> Callable:
    """`sums(params, batch, masks)`: the task's evaluation sums of one global
    batch, compiled, the sums replicated on every device."""
    return jax.jit(task.eval_sums, out_shardings=replicated(mesh))


def make_evaluator(task: Task, mesh) -> Callable[[Any, int], dict[str, float]]:
    """`evaluate(params, step, masks=None) -> {'eval/<name>': ...}`: the means
    of the task's evaluation sums (`sums_to_means`), its derived metrics and
    its generation metrics; `masks` ablates heads (`Task.head_mask_shapes`)."""
    sums_fn = jit_eval_step(task, mesh)

    def evaluate(params, step: int, masks: dict[str, Any] | None = None) -> dict[str, float]:
        totals = None
        for batch in task.eval_batches(jax.process_index(), jax.process_count()):
            sums = sums_fn(params, global_batch(batch, mesh), masks)
            totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
        if totals is None:
            raise ValueError("the evaluation split produced no batches.")
        weight = totals.pop("weight")
        metrics = {k: float(v) for k, v in jax.device_get(
            sums_to_means(totals, weight)).items()}
        metrics.update(task.derived_metrics(metrics))
        metrics.update(task.generation_metrics(params, mesh, step, masks))
        return {f"eval/{k}": v for k, v in metrics.items()}

    return evaluate


def restore_for_inference(config: ml_collections.ConfigDict, workdir: str,
                          step: int | None = None):
    """(task, mesh, params, step) for a workdir's checkpoint (default: latest)."""
    directory = os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR)
    steps = sorted(int(d) for d in os.listdir(directory) if d.isdigit()) if os.path.isdir(
        directory) else []
    if not steps:
        raise CheckpointError(f"{directory} holds no complete checkpoint.")
    step = steps[-1] if step is None else step
    if step not in steps:
        raise CheckpointError(f"no checkpoint for step {step} in {directory}; "
                              f"available: {steps}.")
    task = build_task(config, workdir)
    mesh = mesh_from_config(config.mesh)
    boxed = jax.eval_shape(task.init_variables, jax.random.PRNGKey(0))["params"]
    shardings = logical_shardings(boxed, mesh)
    abstract = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        nn.meta.unbox(boxed), shardings)
    params, _, missing = restore_params(os.path.join(directory, str(step)), abstract)
    if missing:
        raise CheckpointError(f"checkpoint step {step} in {directory} lacks parameters "
                              f"{missing}: it was written by a different model.")
    return task, mesh, params, step


def evaluate_checkpoint(config: ml_collections.ConfigDict, workdir: str,
                        step: int | None = None) -> dict[str, float]:
    """Restores the parameters of `step` (default: latest) and evaluates them."""
    task, mesh, params, step = restore_for_inference(config, workdir, step)
    with jax.set_mesh(mesh):
        metrics = make_evaluator(task, mesh)(params, step)
    return {"step": step, **metrics}
