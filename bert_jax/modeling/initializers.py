"""The parameter initializers of the models, annotated with logical axis names.

`kernel_init` and `embedding_init` pick the initializer `config.initializer`
names: 'truncated_normal' (BERT's, standard deviation `initializer_range`),
'normal', or 'xavier_uniform' (the Transformer's, whose embedding tables are
then drawn from a normal of standard deviation hidden_size^-1/2).
`partitioned` wraps an initializer so that the parameter it makes carries one
logical axis name per dimension (e.g. an attention query kernel
`[embed, heads, kv]`); `bert_jax.training.sharding` maps those names to mesh
axes (`RULES`). `embeddings`, `layers`, `attention` and `bert` make every
parameter through these.
"""

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
