"""Parameter initializers, annotated with logical axis names for sharding."""

from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax

from bert_jax.modeling.configs import StackConfig

Initializer = Callable[..., jax.Array]


def partitioned(init: Initializer, names: tuple[str | None, ...]) -> Initializer:
    """Annotates `init` with logical axis names (mapped to mesh axes by rules).

    Axis names used across the models: `vocab`, `type_vocab`, `position`,
    `embed`, `mlp`, `heads`, `kv`, `classes`.
    """
    return nn.with_logical_partitioning(init, names)


def kernel_init(config: StackConfig) -> Initializer:
    """The kernel initializer named by `config.initializer`."""
    if config.initializer == "xavier_uniform":
        return nn.initializers.xavier_uniform()
    if config.initializer == "normal":
        return nn.initializers.normal(config.initializer_range)
    return nn.initializers.truncated_normal(config.initializer_range)


def embedding_init(config: StackConfig) -> Initializer:
    """Embedding tables: N(0, d^-1/2) for Transformers, else the kernel family."""
    if config.initializer == "xavier_uniform":
        return nn.initializers.normal(config.hidden_size ** -0.5)
    return kernel_init(config)
