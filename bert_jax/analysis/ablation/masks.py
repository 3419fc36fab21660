"""The head groups of a model and their masks (the layout is described in the
package docstring).

A model's heads fall into groups, each with a `(layers, heads)` shape:
`bert_shapes` gives BERT's one group, `{"head_mask": (layers, heads)}`, and
`transformer_shapes` the translation Transformer's three, `encoder`,
`decoder_self` and `cross`; `model_shapes` picks by the model config. A mask
is a float32 array of its group's shape (`ones_masks`: every head kept);
`model_kwargs` turns a dict of masks into the keyword arguments of the
model's `__call__` (BERT's `head_mask`; the Transformer's
`encoder_head_mask`, `decoder_self_head_mask`, `cross_head_mask`), which is
how `launch/ablate.py` feeds them to the evaluation.
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
    """Translation groups -> `Transformer.__call__` keyword arguments; absent
    groups are left out (no mask)."""
    unknown = set(masks) - set(_TRANSFORMER_KWARGS)
    if unknown:
        raise ValueError(f"mask groups {sorted(unknown)}: use {list(TRANSFORMER_GROUPS)}")
    return {_TRANSFORMER_KWARGS[g]: m for g, m in masks.items()}


def model_shapes(model_config) -> dict[str, tuple[int, int]]:
    """The head groups of a task's model (BERT or the Transformer)."""
    if isinstance(model_config, TransformerConfig):
        return transformer_shapes(model_config)
    return bert_shapes(model_config)


def model_kwargs(model_config, masks: Mapping[str, Any]) -> dict[str, Any]:
    """`masks` as keyword arguments of the model's `__call__`: BERT's groups
    are its argument names."""
    if isinstance(model_config, TransformerConfig):
        return transformer_mask_kwargs(masks)
    return dict(masks)


def check_shapes(shapes: Shapes) -> dict[str, tuple[int, int]]:
    """`shapes` with each `(layers, heads)` as ints, checked to be positive."""
    if not shapes:
        raise ValueError("shapes is empty: give e.g. {'head_mask': (layers, heads)}")
    checked = {}
    for group, shape in shapes.items():
        shape = tuple(int(d) for d in shape)
        if len(shape) != 2 or min(shape) <= 0:
            raise ValueError(f"shapes[{group!r}]={shape}: give positive (layers, heads)")
        checked[group] = shape
    return checked


def ones_masks(shapes: Shapes) -> dict[str, np.ndarray]:
    """Every head kept: float32 ones of each group's shape."""
    return {g: np.ones(s, np.float32) for g, s in check_shapes(shapes).items()}
