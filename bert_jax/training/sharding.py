"""The device mesh and the rules that place parameters and batches on it.

`make_mesh` (`mesh_from_config`) builds the `(data, fsdp, tensor)` mesh of a
run; `logical_shardings` gives a `NamedSharding` for every leaf of a parameter
pytree from the logical axis names its initializers attached
(`bert_jax.modeling.initializers`); `global_batch` makes one global `jax.Array`
`[global_batch, ...]`, split over the batch axes, of each feature of the
processes' local numpy batches `[local_batch, ...]`. The train step, the
trainer, evaluation and ahead-of-time compilation place everything through
these.

Mesh axes: `data` (batch split, parameters replicated), `fsdp` (batch split,
parameters sharded along `embed`), `tensor` (heads, MLP and vocabulary split,
as Megatron). A size of -1 takes the remaining devices (`config_schema.mesh_shape`
checks the shape against the devices). Over several TPU slices
(distinct `slice_index`), `config.mesh.shape` is the mesh inside a slice (ICI)
and `config.mesh.dcn_shape` multiplies it across slices, data-parallel by
default (`create_hybrid_device_mesh`): the slow DCN links carry only the
gradient all-reduce. Axis types are `Auto` (recent `jax.make_mesh` defaults to
`Explicit`, which breaks ordinary gathers in losses).

`RULES` maps the parameters' logical axis names (`modeling.initializers`) to
mesh axes; a dimension the mesh axes do not divide is replicated (so a
vocabulary of 30522 works with tensor=4).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from bert_jax.config_schema import MESH_AXES, mesh_shape
from bert_jax.modeling.layers import BATCH_MESH_AXES, SCANNED_LAYERS

BATCH_AXES = BATCH_MESH_AXES  # activations follow it too (modeling.layers.batch_sharded)

RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", BATCH_AXES),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("vocab", "tensor"),
    ("kv", None),
    ("position", None),
    ("type_vocab", None),
    ("classes", None),
    (SCANNED_LAYERS, None),   # the stacked axis of scanned layers
)


def make_mesh(shape: Sequence[int] = (-1, 1, 1), devices=None,
              dcn_shape: Sequence[int] = (-1, 1, 1)) -> Mesh:
    """A `(data, fsdp, tensor)` mesh over `devices` (default: all). Over several
    slices each axis is `dcn_shape[i] * shape[i]` long, slices outermost."""
    devices = list(devices if devices is not None else jax.devices())
    auto = (AxisType.Auto,) * len(MESH_AXES)
    slices = len({getattr(d, "slice_index", 0) for d in devices})
    if slices == 1:
        return jax.make_mesh(mesh_shape(shape, len(devices)), MESH_AXES,
                             axis_types=auto, devices=devices)
    ici = mesh_shape(shape, len(devices) // slices)
    dcn = mesh_shape(dcn_shape, slices, "config.mesh.dcn_shape")
    grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices,
                                                allow_split_physical_axes=True)
    return Mesh(grid, MESH_AXES, axis_types=auto)


def mesh_from_config(mesh_config, devices=None) -> Mesh:
    return make_mesh(tuple(mesh_config.shape), devices,
                     tuple(mesh_config.get("dcn_shape", (-1, 1, 1))))


def _fit(spec: PartitionSpec, shape: tuple[int, ...], mesh: Mesh) -> PartitionSpec:
    fitted = []
    for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        names = (axes,) if isinstance(axes, str) else tuple(axes or ())
        size = math.prod(mesh.shape[a] for a in names)
        fitted.append(axes if names and dim % size == 0 else None)
    return PartitionSpec(*fitted)


def logical_shardings(abstract_tree: Any, mesh: Mesh, rules=RULES) -> Any:
    """NamedShardings of a tree whose leaves may be boxed with logical names
    (e.g. `jax.eval_shape(init)`); unboxed leaves are replicated."""
    specs = nn.get_partition_spec(abstract_tree)
    mesh_specs = nn.logical_to_mesh(specs, rules)
    shapes = jax.tree.map(lambda x: x.shape, nn.meta.unbox(abstract_tree))
    return jax.tree.map(
        lambda spec, shape: NamedSharding(mesh, _fit(spec, shape, mesh)),
        mesh_specs, shapes, is_leaf=lambda x: isinstance(x, PartitionSpec))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def global_batch(local: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """Global arrays sharded over the batch: the processes' `[local_batch, ...]`
    rows concatenated in process order."""
    sharding = batch_sharding(mesh)
    return jax.tree.map(
        lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), local)
