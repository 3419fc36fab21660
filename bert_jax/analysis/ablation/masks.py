"""The head groups of a model and their masks: `shapes` (group -> `(layers,
heads)`) for BERT and the Transformer, all-ones masks, and masks as the
model's keyword arguments (the layout of `masks`: see the package docstring).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from bert_jax.modeling.configs import TransformerConfig

Masks = dict[str, Any]
Shapes = Mapping[str, tuple[int, int]]
MetricFn = Callable[[Masks], float]
LossFn = Callable[..., Any]

BERT_GROUP = "head_mask"
LAYER_GROUP = "layer_mask"
TRANSFORMER_GROUPS = ("encoder", "decoder_self", "cross")
_TRANSFORMER_KWARGS = {"encoder": "encoder_head_mask",
                       "decoder_self": "decoder_self_head_mask",
                       "cross": "cross_head_mask"}


def bert_shapes(config) -> dict[str, tuple[int, int]]:
    """`{'head_mask': (layers, heads)}` for a BertConfig."""
    return {BERT_GROUP: (config.num_layers, config.num_heads)}


def transformer_shapes(config) -> dict[str, tuple[int, int]]:
    """`{'encoder', 'decoder_self', 'cross'}` -> `(layers, heads)` for a
    TransformerConfig."""
    return {"encoder": (config.num_layers, config.num_heads),
            "decoder_self": (config.decoder_layers, config.num_heads),
            "cross": (config.decoder_layers, config.num_heads)}


def transformer_mask_kwargs(masks: Mapping[str, Any]) -> dict[str, Any]:
    """Translation groups -> `Transformer.__call__` keyword arguments
    (`encoder_head_mask`, `decoder_self_head_mask`, `cross_head_mask`); absent
    groups are left out (no mask)."""
    unknown = set(masks) - set(_TRANSFORMER_KWARGS)
    if unknown:
        raise ValueError(f"unknown Transformer mask groups {sorted(unknown)}; expected "
                         f"some of {list(TRANSFORMER_GROUPS)}.")
    return {_TRANSFORMER_KWARGS[g]: m for g, m in masks.items()}


def model_shapes(model_config) -> dict[str, tuple[int, int]]:
    """The head groups of a task's model: `bert_shapes` for BERT models,
    `transformer_shapes` for the encoder-decoder Transformer."""
    if isinstance(model_config, TransformerConfig):
        return transformer_shapes(model_config)
    return bert_shapes(model_config)


def model_kwargs(model_config, masks: Mapping[str, Any]) -> dict[str, Any]:
    """`masks` as keyword arguments of the model's `__call__` (what a task's
    prediction function passes on): BERT's groups are its argument names, the
    Transformer's go through `transformer_mask_kwargs`."""
    if isinstance(model_config, TransformerConfig):
        return transformer_mask_kwargs(masks)
    return dict(masks)


def check_shapes(shapes: Shapes) -> dict[str, tuple[int, int]]:
    """`shapes` with each `(layers, heads)` as ints, checked to be positive."""
    if not shapes:
        raise ValueError("shapes is empty: give at least one group, e.g. "
                         "{'head_mask': (layers, heads)}.")
    checked = {}
    for group, shape in shapes.items():
        shape = tuple(int(d) for d in shape)
        if len(shape) != 2 or min(shape) <= 0:
            raise ValueError(f"shapes[{group!r}]={shape}: expected (layers, heads) with "
                             "both positive.")
        checked[group] = shape
    return checked


def ones_masks(shapes: Shapes) -> dict[str, np.ndarray]:
    """Every head kept: float32 ones of each group's shape."""
    return {g: np.ones(s, np.float32) for g, s in check_shapes(shapes).items()}


def total_heads(shapes: Shapes) -> int:
    return sum(l * h for l, h in shapes.values())
