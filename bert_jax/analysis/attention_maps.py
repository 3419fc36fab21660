"""Attention probabilities of a BERT or translation Transformer, and their plots.

Every MultiHeadAttention sows its probabilities `[batch, heads, q, k]` in the
`intermediates` collection when it is mutable (einsum only: the fused kernel
cannot expose them, so these calls switch to einsum):

    probs = attention_probabilities(BertModel(config), params, input_ids,
                                    token_type_ids=types)    # [layers, heads, q, k]
    groups = attention_probabilities_by_group(Transformer(config), params,
                                              inputs, targets)
    groups["encoder"], groups["decoder_self"], groups["cross"]   # each [L, H, q, k]

For the Transformer the decoder's queries are its inputs: the targets shifted
right (`[BOS] t_1 ... t_{n-1}`). Probabilities are after the head mask (if one
is passed) and without dropout (`deterministic=True`).

`plot_heads`, `plot_head` and `plot_token_attention` draw them with token
labels (`launch/visualize_attention.py`).
"""

from __future__ import annotations

import functools
import re
from typing import Any, Mapping, Sequence

import flax.linen as nn
import jax
import numpy as np
from flax import traverse_util

from bert_jax.modeling.layers import SCANNED_LAYERS

SOWN_NAME = "attention_weights"
# (stack, attention module) -> group name.
_GROUPS = {("encoder", "attention"): "encoder",
           ("encoder", "self_attention"): "encoder",
           ("decoder", "self_attention"): "decoder_self",
           ("decoder", "cross_attention"): "cross"}
_LAYER = re.compile(r"layer_(\d+)$")


_TRACED = "<traced>"


@functools.lru_cache(maxsize=16)
def _compiled(model: nn.Module, method, template: tuple, static_kwargs: tuple):
    """`(variables, traced args by position, traced kwargs) -> intermediates`."""
    def run(variables, dynamic_args, dynamic_kwargs):
        full = [dynamic_args[i] if i in dynamic_args else a for i, a in enumerate(template)]
        return model.apply(variables, *full, method=method, mutable=["intermediates"],
                           **dict(static_kwargs), **dynamic_kwargs)[1]
    return jax.jit(run)


def attention_probabilities_by_group(model: nn.Module, params: Mapping[str, Any], *args,
                                     batch_index: int | None = 0, method=None,
                                     **kwargs) -> dict[str, np.ndarray]:
    """Runs `model.apply(params, *args, **kwargs)` (deterministic, einsum
    attention) and collects every attention layer's probabilities.

    Returns group -> float32 `[layers, heads, q, k]` (or `[layers, batch, heads,
    q, k]` with `batch_index=None`): 'encoder' for BERT and the Transformer's
    encoder, 'decoder_self' and 'cross' for its decoder. Works for unscanned
    (`layer_<i>`) and scanned (`layers/layer`) parameter layouts, and for any
    BERT task model (the encoder under `bert`).
    """
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "attention_impl", "einsum") != "einsum":
        model = model.clone(config=config.replace(attention_impl="einsum"))
    kwargs.setdefault("deterministic", True)
    # Compiled (faster than op-by-op on CPU) and cached for repeated calls:
    # arrays are traced, anything else (flags, None) is static.
    arrays = (jax.Array, np.ndarray)
    traced_args = {i: a for i, a in enumerate(args) if isinstance(a, arrays)}
    traced_kwargs = {k: v for k, v in kwargs.items() if isinstance(v, arrays)}
    template = tuple(_TRACED if i in traced_args else a for i, a in enumerate(args))
    static_kwargs = tuple(sorted((k, v) for k, v in kwargs.items()
                                 if k not in traced_kwargs))
    try:
        run = _compiled(model, method, template, static_kwargs)
    except TypeError:  # an unhashable static argument
        run = _compiled.__wrapped__(model, method, template, static_kwargs)
    params = nn.meta.unbox(params)
    state = run({"params": params.get("params", params)}, traced_args, traced_kwargs)
    flat = traverse_util.flatten_dict(nn.meta.unbox(state.get("intermediates", {})))
    found: dict[str, dict[int, np.ndarray]] = {}
    for path, value in flat.items():
        if SOWN_NAME not in path:
            continue
        path = path[:path.index(SOWN_NAME)]
        weights = np.asarray(value[0] if isinstance(value, (tuple, list)) else value,
                             np.float32)
        if SCANNED_LAYERS in path:  # scanned: [layers, batch, heads, q, k]
            index, layers = path.index(SCANNED_LAYERS), dict(enumerate(weights))
        else:
            index = next(i for i, p in enumerate(path) if _LAYER.match(str(p)))
            layers = {int(_LAYER.match(path[index]).group(1)): weights}
        stack, module = (path[index - 1] if index else ""), path[-1]
        found.setdefault(_GROUPS.get((stack, module), f"{stack}/{module}"), {}).update(layers)
    if not found:
        raise ValueError(f"the model sowed no {SOWN_NAME!r}: not a bert_jax BERT or "
                         "Transformer?")
    result = {}
    for group, layers in found.items():
        stacked = np.stack([layers[i] for i in sorted(layers)])  # [L, batch, H, q, k]
        result[group] = stacked if batch_index is None else stacked[:, batch_index]
    return result


def attention_probabilities(model: nn.Module, params: Mapping[str, Any], input_ids,
                            *args, batch_index: int | None = 0, method=None,
                            **kwargs) -> np.ndarray:
    """Attention probabilities of a single-stack model (BERT): float32
    `[layers, heads, q, k]` of batch row `batch_index` (`[layers, batch, heads,
    q, k]` with None). Extra arguments go to the model (`attention_mask`,
    `token_type_ids`, `head_mask`, ...). For an encoder-decoder Transformer
    (several groups) use `attention_probabilities_by_group`; with
    `method=Transformer.encode` this returns the encoder's.
    """
    groups = attention_probabilities_by_group(model, params, input_ids, *args,
                                              batch_index=batch_index, method=method,
                                              **kwargs)
    if len(groups) != 1:
        raise ValueError(f"attention groups {sorted(groups)}: use "
                         "attention_probabilities_by_group")
    return next(iter(groups.values()))


def _label_axes(ax, x_tokens: Sequence[str], y_tokens: Sequence[str], fontsize: float):
    ax.set_xticks(range(len(x_tokens)))
    ax.set_xticklabels(x_tokens, rotation=90, fontsize=fontsize)
    ax.set_yticks(range(len(y_tokens)))
    ax.set_yticklabels(y_tokens, fontsize=fontsize)


def plot_head(weights: np.ndarray, query_tokens: Sequence[str],
              key_tokens: Sequence[str] | None, path: str, *, title: str = "") -> None:
    """One head's `[q, k]` probabilities: queries down, keys across, token
    labels on both axes, a colour bar."""
    from matplotlib.figure import Figure
    key_tokens = query_tokens if key_tokens is None else key_tokens
    q, k = weights.shape
    size = max(4.0, 0.32 * max(q, k) + 2.0)
    fig = Figure(figsize=(size + 1.2, size))
    ax = fig.subplots()
    image = ax.imshow(weights, cmap="viridis", vmin=0.0, aspect="auto")
    _label_axes(ax, key_tokens, query_tokens, fontsize=10)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    ax.set_title(title)
    fig.colorbar(image, ax=ax, label="attention probability", fraction=0.046, pad=0.04)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_heads(weights: np.ndarray, query_tokens: Sequence[str],
               key_tokens: Sequence[str] | None, path: str, *, title: str = "",
               columns: int = 4) -> None:
    """All heads of a layer, `[heads, q, k]`, in a grid, token labels on both
    axes of every panel, one shared colour bar (0 .. the layer's maximum)."""
    from matplotlib.figure import Figure
    key_tokens = query_tokens if key_tokens is None else key_tokens
    heads, q, k = weights.shape
    columns = min(columns, heads)
    rows = -(-heads // columns)
    panel = max(3.0, 0.22 * max(q, k) + 1.2)
    fig = Figure(figsize=(panel * columns + 1.5, panel * rows + 0.6))
    axes = fig.subplots(rows, columns, squeeze=False)
    vmax = float(weights.max()) or 1.0
    fontsize = 8 if max(q, k) <= 24 else 6
    image = None
    for h in range(rows * columns):
        ax = axes[h // columns][h % columns]
        if h >= heads:
            ax.axis("off")
            continue
        image = ax.imshow(weights[h], cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto")
        _label_axes(ax, key_tokens, query_tokens, fontsize=fontsize)
        ax.set_title(f"head {h}", fontsize=11)
    fig.suptitle(title, fontsize=14)
    fig.tight_layout(rect=(0, 0, 0.93, 0.97))
    colorbar_axes = fig.add_axes((0.945, 0.15, 0.015, 0.7))
    fig.colorbar(image, cax=colorbar_axes, label="attention probability")
    fig.savefig(path, dpi=100)


def plot_token_attention(weights: np.ndarray, query: int, key_tokens: Sequence[str],
                         path: str, *, title: str = "") -> None:
    """The attention of query position `query` to every key, for every head of
    every layer: `weights` `[layers, heads, q, k]` -> a `[layers * heads, k]`
    heatmap (rows 'L<l> H<h>', lines between layers) beside the per-layer mean
    over heads `[layers, k]`; a colour bar each."""
    from matplotlib.figure import Figure
    layers, heads, _, k = weights.shape
    rows = weights[:, :, query, :]  # [L, H, k]
    all_heads = rows.reshape(layers * heads, k)
    mean = rows.mean(axis=1)
    width = max(7.0, 0.4 * k + 3.0)
    height_all = max(4.0, 0.17 * layers * heads + 1.5)
    height_mean = max(2.0, 0.3 * layers + 1.5)
    fig = Figure(figsize=(width, height_all + height_mean))
    ax_mean, ax_all = fig.subplots(2, 1, gridspec_kw={"height_ratios": [height_mean,
                                                                        height_all]})
    for ax, data, labels, sub in (
            (ax_mean, mean, [f"L{l}" for l in range(layers)], "mean over heads"),
            (ax_all, all_heads, [f"L{l} H{h}" for l in range(layers) for h in range(heads)],
             "every head")):
        image = ax.imshow(data, cmap="viridis", vmin=0.0, aspect="auto")
        ax.set_xticks(range(k))
        ax.set_xticklabels(key_tokens, rotation=90, fontsize=10)
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels(labels, fontsize=7 if len(labels) > 24 else 9)
        ax.get_xticklabels()[query].set_color("red")
        ax.set_title(sub, fontsize=10)
        fig.colorbar(image, ax=ax, label="attention probability", fraction=0.04, pad=0.02)
    for l in range(1, layers):
        ax_all.axhline(l * heads - 0.5, color="white", linewidth=1.0)
    fig.suptitle(title, fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.45 / fig.get_figheight()))
    fig.savefig(path, dpi=100)
