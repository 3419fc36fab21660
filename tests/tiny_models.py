"""Tiny model configs and fast helpers shared by the module tests."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.modeling.configs import BertConfig, TransformerConfig

BERT = BertConfig(hidden_size=32, num_heads=2, mlp_dim=64, num_layers=2, max_len=16,
                  vocab_size=50)
TRANSFORMER = TransformerConfig(hidden_size=32, num_heads=4, mlp_dim=64, num_layers=2,
                                max_len=16, vocab_size=50)  # pad_id 0, bos 1, eos 2


def random_variables(model, *args, seed=0, scale=0.2, **kwargs):
    """`{'params': ...}` for `model`, drawn with numpy: N(0, scale²) entries,
    LayerNorm scales around 1. Shapes come from `jax.eval_shape(model.init)`,
    so no initializer is compiled (the test suite runs on a small CPU)."""
    shapes = nn.unbox(jax.eval_shape(
        lambda: model.init(jax.random.PRNGKey(0), *args, **kwargs)))["params"]
    rng = np.random.default_rng(seed)

    def draw(path, leaf):
        x = scale * rng.normal(size=leaf.shape)
        if getattr(path[-1], "key", None) == "scale":
            x += 1.0
        return jnp.asarray(x, leaf.dtype)

    return {"params": jax.tree_util.tree_map_with_path(draw, shapes)}


@functools.lru_cache(maxsize=None)
def jitted(model, method=None, mutable=(), **static):
    """`model.apply` compiled once per (model, method, mutable, static kwargs).

    One XLA program compiles faster on CPU than the op-by-op programs of an
    eager call; array arguments (masks, rngs) stay dynamic."""
    def fn(variables, *args, **kwargs):
        return model.apply(variables, *args, method=method,
                           mutable=list(mutable) if mutable else False,
                           **static, **kwargs)
    return jax.jit(fn)


def max_diff(a, b):
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())


def translation_preprocess(example) -> dict[str, np.ndarray]:
    """`{'inputs', 'targets'}` of a `synthetic_reverse` example as int32."""
    return {"inputs": np.asarray(example["inputs"], np.int32),
            "targets": np.asarray(example["targets"], np.int32)}
