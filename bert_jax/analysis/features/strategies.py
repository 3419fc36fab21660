r"""Layer strategies of the feature-based approach (BERT paper, Table 7):
which hidden states of a frozen encoder make a word's features.

`hidden_states[0]` is the embedding output, `hidden_states[i]` the output of
layer i, `L` layers in all:

  embeddings         hidden_states[0]                                  hidden
  last               hidden_states[L]                                  hidden
  second_to_last     hidden_states[L - 1]                              hidden
  sum_last_four      hidden_states[L - 3] + ... + hidden_states[L]     hidden
  concat_last_four   [hidden_states[L - 3], ..., hidden_states[L]]     4 * hidden
                     (ascending layer order: the last layer is the last block)
  weighted_sum       gamma * sum_j softmax(logits)_j hidden_states[j] over all
                     L + 1 states (ELMo's scalar mix; logits and gamma learned
                     with the probe)                                    hidden
  layer_<i>          hidden_states[i], 0 <= i <= L                     hidden
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

import jax.numpy as jnp
import numpy as np

Array = Any  # jax.Array or np.ndarray

STRATEGIES = ("embeddings", "last", "second_to_last", "sum_last_four",
              "concat_last_four", "weighted_sum")
_LAYER = re.compile(r"layer_([0-9]+)")


def check_strategy(strategy: str, num_states: int | None = None) -> None:
    """Raises ValueError unless `strategy` is one of STRATEGIES or `layer_<i>`
    (and, given `num_states` = layers + 1, valid for that many states)."""
    match = _LAYER.fullmatch(strategy) if isinstance(strategy, str) else None
    if strategy not in STRATEGIES and match is None:
        raise ValueError(f"strategy={strategy!r} unknown: use {list(STRATEGIES)} or layer_<i>")
    if num_states is None:
        return
    if match is not None and int(match.group(1)) >= num_states:
        raise ValueError(f"strategy={strategy!r}: use layers 0..{num_states - 1}")
    if strategy.endswith("_last_four") and num_states < 5:
        raise ValueError(f"strategy={strategy!r}: needs at least 4 layers, not {num_states - 1}")
    if strategy == "second_to_last" and num_states < 2:
        raise ValueError("strategy='second_to_last': needs at least 1 layer")


def feature_dim(strategy: str, hidden_size: int) -> int:
    """Width of the features of `strategy` for a model of `hidden_size`."""
    check_strategy(strategy)
    return 4 * hidden_size if strategy == "concat_last_four" else hidden_size


def _stack(hidden_states) -> tuple[Array, Any]:
    """`[layers + 1, ..., hidden]` and the array module (numpy for numpy inputs)."""
    if isinstance(hidden_states, (list, tuple)):
        if not hidden_states:
            raise ValueError("hidden_states is empty; pass layers + 1 arrays.")
        if all(isinstance(h, np.ndarray) for h in hidden_states):
            return np.stack(hidden_states), np
        return jnp.stack(hidden_states), jnp
    if isinstance(hidden_states, np.ndarray):
        return hidden_states, np
    return jnp.asarray(hidden_states), jnp


def combine_layers(hidden_states: Sequence[Array] | Array, strategy: str,
                   weights: Mapping[str, Array] | Array | None = None) -> Array:
    """Features of one layer strategy (see the module docstring).

    Args:
      hidden_states: `layers + 1` arrays `[..., hidden]` (embeddings first), or
        them stacked `[layers + 1, ..., hidden]` (e.g. `[layers + 1, batch,
        length, hidden]` or one sentence's `[layers + 1, words, hidden]`).
      strategy: one of STRATEGIES or `layer_<i>`.
      weights: only for `weighted_sum`: `{"logits": [layers + 1], "gamma": ()}`
        (the mix is `gamma * sum_j softmax(logits)_j h_j`), or the logits alone
        (gamma 1); None gives uniform weights and gamma 1 (the mean of all
        states).

    Returns:
      `[..., features]`: hidden, or 4 * hidden for `concat_last_four`. numpy in,
      numpy out; jax arrays (or tracers) in, jax out.
    """
    stacked, xp = _stack(hidden_states)
    if stacked.ndim < 2:
        raise ValueError(f"hidden_states has shape {stacked.shape}; expected "
                         "[layers + 1, ..., hidden].")
    num_states = stacked.shape[0]
    check_strategy(strategy, num_states)
    if weights is not None and strategy != "weighted_sum":
        raise ValueError(f"weights are only used by strategy='weighted_sum', not "
                         f"{strategy!r}.")
    if strategy == "embeddings":
        return stacked[0]
    if strategy == "last":
        return stacked[-1]
    if strategy == "second_to_last":
        return stacked[-2]
    if strategy == "sum_last_four":
        return stacked[-4:].sum(axis=0)
    if strategy == "concat_last_four":
        return xp.concatenate([stacked[i] for i in range(num_states - 4, num_states)],
                              axis=-1)
    if strategy == "weighted_sum":
        if weights is None:
            logits, gamma = xp.zeros((num_states,), stacked.dtype), 1.0
        elif isinstance(weights, Mapping):
            logits, gamma = weights["logits"], weights.get("gamma", 1.0)
        else:
            logits, gamma = weights, 1.0
        if np.shape(logits) != (num_states,):
            raise ValueError(f"weighted_sum logits have shape {np.shape(logits)}; expected "
                             f"({num_states},), one per hidden state (embeddings included).")
        logits = xp.asarray(logits, stacked.dtype)
        scalars = xp.exp(logits - logits.max())
        scalars = scalars / scalars.sum()
        mixed = xp.tensordot(scalars, stacked, axes=1)
        return (xp.asarray(gamma, stacked.dtype) * mixed).astype(stacked.dtype)
    return stacked[int(_LAYER.fullmatch(strategy).group(1))]
