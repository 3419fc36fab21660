"""The embedding layers: token (and segment) tables and position embeddings.

`token_embedding` makes an `nn.Embed` table `[vocab, embed]` that maps int ids
`[batch, length]` to `[batch, length, embed]` in the compute dtype, and whose
`.attend(x)` gives logits `[..., vocab]` against the same table (the tied
output of BERT's masked LM and of the Transformer). BERT uses it for the word
and token-type (segment) tables (`bert.BertEmbeddings`), the Transformer for
its source and target tables. `PositionEmbedding` maps int positions
`[batch, length]` to `[batch, length, embed]`.

Position embeddings are either learned (a `[max_len, embed]` table, BERT) or the
fixed sinusoidal table of Vaswani et al. 2017, section 3.5:

    PE(pos, 2i)   = sin(pos / 10000^(2i / d_model))
    PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))

`tile_learned_positions` fills the rows a shorter pretraining never trained
with copies of the ones it did (a run continued at a longer sequence:
`config.init_tile_positions`).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from flax import traverse_util

from bert_jax.modeling.configs import StackConfig
from bert_jax.modeling.initializers import embedding_init, partitioned

Array = jax.Array


def sinusoidal_table(max_len: int, features: int) -> np.ndarray:
    """The paper's table, `[max_len, features]` float32 (sin at even, cos at odd)."""
    positions = np.arange(max_len, dtype=np.float64)[:, None]
    even = np.arange(0, features, 2, dtype=np.float64)
    angles = positions / np.power(10000.0, even / features)
    table = np.zeros((max_len, features), dtype=np.float64)
    table[:, 0::2] = np.sin(angles)
    table[:, 1::2] = np.cos(angles[:, : features // 2])
    return table.astype(np.float32)


def tile_learned_positions(params, trained: int):
    """`params` with each learned position table (`position_embeddings/embedding`,
    `[max_len, embed]`) holding rows 0..trained-1 repeated over all its rows:
    the copy initialization of Longformer (Beltagy et al. 2020, arXiv 2004.05150,
    section 5 and Table 5: masked-LM BPC 1.957 after copying RoBERTa's 512
    positions to 4,096, against 10.299 with the new rows random), which keeps
    what attention learned about neighbouring positions. Returns the params
    and the number of tables tiled; each keeps its sharding."""
    flat = traverse_util.flatten_dict(params)
    tiled = 0
    for key, table in flat.items():
        if key[-2:] == ("position_embeddings", "embedding") and 0 < trained < table.shape[0]:
            repeats = -(-table.shape[0] // trained)
            copied = jnp.tile(table[:trained], (repeats, 1))[:table.shape[0]]
            flat[key] = jax.device_put(copied, table.sharding)
            tiled += 1
    return traverse_util.unflatten_dict(flat), tiled


def token_embedding(config: StackConfig, vocab_size: int, name: str | None = None,
                    axis_name: str = "vocab") -> nn.Embed:
    """An `[vocab, embed]` table; `.attend(x)` gives tied output logits."""
    return nn.Embed(
        num_embeddings=vocab_size, features=config.hidden_size,
        embedding_init=partitioned(embedding_init(config), (axis_name, "embed")),
        dtype=config.compute_dtype, param_dtype=config.params_dtype, name=name)


class PositionEmbedding(nn.Module):
    """`kind='learned'` owns a parameter `embedding` `[max_len, embed]`;
    `kind='sinusoidal'` uses the fixed table and has no parameters. With
    `decode=True` the positions come from a counter in the `cache` collection
    (the number of tokens fed so far) instead of the argument."""

    config: StackConfig
    kind: str = "learned"
    decode: bool = False

    @nn.compact
    def __call__(self, positions: Array) -> Array:
        """`[batch, length]` int positions -> `[batch, length, embed]`."""
        cfg = self.config
        if self.decode:
            positions = self._decode_positions(positions)
        elif not isinstance(positions, jax.core.Tracer) and positions.size:
            # Concrete inputs are checked here; under jit an out-of-range
            # position reads NaN (jnp.take's fill), never a clipped row.
            low, high = int(np.min(positions)), int(np.max(positions))
            if low < 0 or high >= cfg.max_len:
                raise ValueError(f"position ids span [{low}, {high}]; config.model.max_len="
                                 f"{cfg.max_len} allows [0, {cfg.max_len}).")
        if self.kind == "sinusoidal":
            table = jnp.asarray(sinusoidal_table(cfg.max_len, cfg.hidden_size))
        else:
            table = self.param(
                "embedding",
                partitioned(embedding_init(cfg), ("position", "embed")),
                (cfg.max_len, cfg.hidden_size),
                cfg.params_dtype,
            )
        return jnp.take(table, positions, axis=0).astype(cfg.compute_dtype)

    def _decode_positions(self, positions: Array) -> Array:
        initialized = self.has_variable("cache", "index")
        if not initialized and not self.is_initializing():
            raise ValueError(f"{self.path}: decode=True needs the 'cache' collection of "
                             "an `init` with a full-length target (mutable=['cache']).")
        index = self.variable("cache", "index", lambda: jnp.array(0, jnp.int32))
        if not initialized:  # `init` call: shapes only.
            return positions
        start = index.value
        index.value = start + positions.shape[1]
        return jnp.broadcast_to(start + jnp.arange(positions.shape[1]), positions.shape)
