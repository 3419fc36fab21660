"""Attention-head and layer ablation, head importance and iterative pruning.

After Michel, Levy and Neubig (2019), "Are Sixteen Heads Really Better than
One?". Everything here is model-agnostic: the caller supplies

  * `metric_fn(masks) -> float`: evaluates the model with the given masks on an
    evaluation set, higher is better (accuracy, BLEU, -loss, ...);
  * `loss_fn(masks) -> scalar jax array`: a differentiable loss (summed or
    averaged over an evaluation set) whose gradient w.r.t. the masks gives the
    head importance scores.

`masks` is a dict of arrays, one entry per group of heads:

  BERT                    {'head_mask': [layers, heads]} (+ 'layer_mask': [layers])
  translation Transformer {'encoder': [L, H], 'decoder_self': [L, H], 'cross': [L, H]}

and `shapes` (`shape_by_group`) gives each group's `(layers, heads)`:
`bert_shapes(config)` and `transformer_shapes(config)` build them, and
`transformer_mask_kwargs(masks)` turns the translation groups into the keyword
arguments of `Transformer.__call__`. A head mask entry multiplies that head's
attention probabilities (0 removes the head, see `bert_jax.modeling.attention`).

    shapes = bert_shapes(config)
    def metric_fn(masks):   # accuracy on a dev set
        logits = model.apply(variables, ids, attention, types, **masks)
        return float((logits.argmax(-1) == labels).mean() * 100)
    def loss_fn(masks):     # differentiable w.r.t. masks["head_mask"]
        logits = model.apply(variables, ids, attention, types, **masks)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    results = run_ablations(metric_fn, loss_fn, shapes, num_layers=config.num_layers)
    write_report(results, "ablation_report", metric_name="accuracy")

Results (`write_report`): JSON, a Markdown summary with tables, heatmaps
`[layers x heads]` of each score and the pruning curve (metric vs fraction of
heads pruned).
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.file_io import jsonable
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


class PruningStep(NamedTuple):
    """One point of a pruning curve: the fraction of all heads pruned, the
    number of heads that remain, and the metric with those heads."""

    fraction: float
    heads_remaining: int
    metric: float


# ----------------------------------------------------------------------------
# Shapes and masks.


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


def _check_shapes(shapes: Shapes) -> dict[str, tuple[int, int]]:
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
    return {g: np.ones(s, np.float32) for g, s in _check_shapes(shapes).items()}


def _total_heads(shapes: Shapes) -> int:
    return sum(l * h for l, h in shapes.values())


def _as_float(value: Any) -> float:
    return float(np.asarray(value))


# ----------------------------------------------------------------------------
# Ablations.


def single_head_ablation(metric_fn: MetricFn, shape_by_group: Shapes, *,
                         baseline: float | None = None) -> dict[str, np.ndarray]:
    """The metric change when each head alone is removed.

    Returns group -> `[layers, heads]` of `metric(head removed) - metric(all
    heads)` (negative: the head helps). `baseline`, the metric with all ones,
    is computed when not given. `metric_fn` runs `1 + total heads` times.
    """
    shapes = _check_shapes(shape_by_group)
    if baseline is None:
        baseline = _as_float(metric_fn(ones_masks(shapes)))

    def remove(mask, l, h):
        mask[l, h] = 0.0

    return {group: metric - baseline
            for group, metric in _per_head_metric(metric_fn, shapes, remove).items()}


def _per_head_metric(metric_fn: MetricFn, shapes: Shapes, edit) -> dict[str, np.ndarray]:
    """group -> `[layers, heads]`: the metric with all-ones masks but the
    group's mask changed in place by `edit(mask, l, h)`."""
    ones = ones_masks(shapes)
    result = {}
    for group, (layers, heads) in shapes.items():
        metric = np.zeros((layers, heads))
        for l in range(layers):
            for h in range(heads):
                masks = {g: m.copy() for g, m in ones.items()}
                edit(masks[group], l, h)
                metric[l, h] = _as_float(metric_fn(masks))
        result[group] = metric
    return result


def keep_one_head(metric_fn: MetricFn, shape_by_group: Shapes) -> dict[str, np.ndarray]:
    """The metric when a layer keeps a single head.

    Returns group -> `[layers, heads]`: entry `[l, h]` is the metric when only
    head `h` of layer `l` remains (the layer's other heads zero; every other
    layer and group complete). Compare with the baseline (all ones): Michel et
    al., Table 2 ("best head only").
    """
    def keep_only(mask, l, h):
        mask[l, :] = 0.0
        mask[l, h] = 1.0

    return _per_head_metric(metric_fn, _check_shapes(shape_by_group), keep_only)


def layer_ablation(metric_fn: MetricFn, num_layers: int | Mapping[str, int], *,
                   baseline: float | None = None) -> dict[str, np.ndarray]:
    """The metric change when each layer alone is skipped (made the identity).

    `num_layers`: an int passes `{'layer_mask': bool [num_layers]}` to
    `metric_fn` (BERT's `layer_mask`); a mapping group -> layers (e.g.
    `{'encoder_layers': 6, 'decoder_layers': 6}`, for the caller to route to
    `Transformer.encode`/`decode`'s `layer_mask`) ablates each group in turn,
    the others all True. Returns group -> `[layers]` of `metric(layer skipped)
    - metric(all layers)`; `baseline` is computed with every mask True when
    not given.
    """
    groups = ({LAYER_GROUP: num_layers} if isinstance(num_layers, (int, np.integer))
              else dict(num_layers))
    if not groups or any(int(n) <= 0 for n in groups.values()):
        raise ValueError(f"num_layers={num_layers!r}: expected a positive int or a "
                         "mapping group -> positive int.")
    full = {g: np.ones(int(n), bool) for g, n in groups.items()}
    if baseline is None:
        baseline = _as_float(metric_fn(full))
    result = {}
    for group, n in groups.items():
        change = np.zeros(int(n))
        for l in range(int(n)):
            masks = {g: m.copy() for g, m in full.items()}
            masks[group][l] = False
            change[l] = _as_float(metric_fn(masks)) - baseline
        result[group] = change
    return result


# ----------------------------------------------------------------------------
# Head importance (Michel et al. 2019, section 4.1).


def normalize_per_layer(scores: np.ndarray, exponent: float = 2.0) -> np.ndarray:
    """Divides each layer's (row's) scores by their L`exponent` norm, as the
    paper's code does before pruning (so layers are comparable)."""
    scores = np.asarray(scores, np.float64)
    norm = np.power(np.power(np.abs(scores), exponent).sum(-1, keepdims=True),
                    1.0 / exponent)
    return scores / (norm + 1e-20)


def head_importance(loss_fn: LossFn, shapes: Shapes, *,
                    at: Mapping[str, Any] | None = None,
                    batches: Iterable[Any] | None = None,
                    normalize: bool = False) -> dict[str, np.ndarray]:
    """Head importance scores `|∂L/∂ξ_h|`: the sensitivity of the loss to each
    head's mask variable `ξ_h`, taken at `ξ = 1` (or at the masks `at`).

    Args:
      loss_fn: `loss_fn(masks) -> scalar`; with `batches`,
        `loss_fn(masks, batch) -> scalar` for each batch.
      shapes: group -> `(layers, heads)`; the gradient is taken w.r.t. these
        float32 arrays.
      at: the masks to differentiate at (default all ones), e.g. the current
        masks during pruning.
      batches: optional; the score is then `Σ_batches |∂L_b/∂ξ|` (the paper's
        code: absolute values per batch, so opposite signs on different
        batches do not cancel). Without it: `|∂L/∂ξ|` of the single loss.
      normalize: divide each layer's scores by their L2 norm (the paper's
        code; makes layers comparable for pruning).

    Returns group -> float64 `[layers, heads]`.
    """
    shapes = _check_shapes(shapes)
    point = ones_masks(shapes) if at is None else {
        g: np.asarray(at[g], np.float32) for g in shapes}
    point = {g: jnp.asarray(m) for g, m in point.items()}
    if batches is None:
        grads = jax.grad(lambda m: jnp.asarray(loss_fn(m), jnp.float32))(point)
        scores = {g: np.abs(np.asarray(grads[g], np.float64)) for g in shapes}
    else:
        grad_fn = jax.grad(lambda m, b: jnp.asarray(loss_fn(m, b), jnp.float32))
        scores = {g: np.zeros(s) for g, s in shapes.items()}
        count = 0
        for batch in batches:
            grads = grad_fn(point, batch)
            for g in shapes:
                scores[g] += np.abs(np.asarray(grads[g], np.float64))
            count += 1
        if not count:
            raise ValueError("batches is empty.")
    if normalize:
        scores = {g: normalize_per_layer(s) for g, s in scores.items()}
    return scores


# ----------------------------------------------------------------------------
# Iterative pruning (Michel et al. 2019, section 4.2).


def iterative_pruning(metric_fn: MetricFn, loss_fn: LossFn, shapes: Shapes, *,
                      fraction_per_step: float = 0.1, recompute_importance: bool = True,
                      normalize: bool = True, keep_one_per_layer: bool = True,
                      batches: Sequence[Any] | None = None,
                      callback: Callable[[PruningStep, dict[str, np.ndarray]], None]
                      | None = None) -> list[PruningStep]:
    """Prunes the least important heads step by step; returns the pruning curve.

    Each step removes `max(1, round(fraction_per_step * total heads))` of the
    remaining heads with the lowest importance (`head_importance`, compared
    across every layer and group), then evaluates `metric_fn`. The curve runs
    from 0 heads pruned to all of them, or to one head per layer with
    `keep_one_per_layer` (a layer never loses its last head).

    Args:
      recompute_importance: recompute the importance at the current masks after
        every step (the paper's code), or rank once at all ones.
      normalize: per-layer L2 normalisation of the scores (the paper found it
        important for pruning across layers).
      batches: passed to `head_importance` (then `loss_fn(masks, batch)`).
      callback: called with each step and its masks (e.g. to log or save them).

    Returns a list of `PruningStep(fraction, heads_remaining, metric)`, the
    first one with nothing pruned.
    """
    shapes = _check_shapes(shapes)
    if not 0.0 < fraction_per_step <= 1.0:
        raise ValueError(f"fraction_per_step={fraction_per_step}: must be in (0, 1].")
    total = _total_heads(shapes)
    per_step = max(1, int(round(fraction_per_step * total)))
    masks = ones_masks(shapes)

    def evaluate() -> PruningStep:
        remaining = int(sum(m.sum() for m in masks.values()))
        step = PruningStep((total - remaining) / total, remaining,
                           _as_float(metric_fn({g: m.copy() for g, m in masks.items()})))
        if callback is not None:
            callback(step, {g: m.copy() for g, m in masks.items()})
        return step

    curve = [evaluate()]
    importance = None
    while True:
        if importance is None or recompute_importance:
            importance = head_importance(loss_fn, shapes, at=masks, batches=batches)
            for g in shapes:  # rank the remaining heads only
                importance[g] = np.where(masks[g] > 0, importance[g], 0.0)
                if normalize:
                    importance[g] = normalize_per_layer(importance[g])
        candidates = sorted(
            (importance[g][l, h], gi, l, h)
            for gi, g in enumerate(shapes) for l, h in zip(*np.nonzero(masks[g])))
        pruned = 0
        for _, gi, l, h in candidates:
            if pruned == per_step:
                break
            g = list(shapes)[gi]
            if keep_one_per_layer and masks[g][l].sum() <= 1:
                continue
            masks[g][l, h] = 0.0
            pruned += 1
        if not pruned:
            break
        curve.append(evaluate())
    return curve


def largest_prunable_fraction(curve: Sequence[tuple[float, int, float]], baseline: float,
                              tolerance: float = 1.0) -> float:
    """The largest fraction of heads pruned before the metric first falls more
    than `tolerance` (in the metric's units, e.g. 1 accuracy point or 1 BLEU)
    below `baseline`. 0.0 when the first pruning step already does."""
    best = 0.0
    for fraction, _, metric in curve:
        if metric < baseline - tolerance:
            break
        best = max(best, float(fraction))
    return best


# ----------------------------------------------------------------------------
# Everything at once.


def run_ablations(metric_fn: MetricFn, loss_fn: LossFn | None, shapes: Shapes, *,
                  num_layers: int | Mapping[str, int] | None = None,
                  layer_metric_fn: MetricFn | None = None,
                  fraction_per_step: float = 0.1, tolerance: float = 1.0,
                  keep_one: bool = True,
                  batches: Sequence[Any] | None = None) -> dict[str, Any]:
    """Runs every analysis and returns the results dict `write_report` takes.

    `layer_metric_fn` (default `metric_fn`) receives the layer masks of
    `layer_ablation` (skipped when `num_layers` is None); `loss_fn` None skips
    importance and pruning; `keep_one` False skips `keep_one_head`.
    """
    shapes = _check_shapes(shapes)
    baseline = _as_float(metric_fn(ones_masks(shapes)))
    results: dict[str, Any] = {
        "baseline": baseline,
        "shapes": {g: list(s) for g, s in shapes.items()},
        "single_head_ablation": single_head_ablation(metric_fn, shapes, baseline=baseline),
    }
    if keep_one:
        results["keep_one_head"] = keep_one_head(metric_fn, shapes)
    if num_layers is not None:
        results["layer_ablation"] = layer_ablation(layer_metric_fn or metric_fn, num_layers)
    if loss_fn is not None:
        results["head_importance"] = head_importance(loss_fn, shapes, batches=batches)
        results["head_importance_normalized"] = {
            g: normalize_per_layer(s) for g, s in results["head_importance"].items()}
        curve = iterative_pruning(metric_fn, loss_fn, shapes,
                                  fraction_per_step=fraction_per_step, batches=batches)
        results["pruning_curve"] = curve
        results["tolerance"] = tolerance
        results["largest_prunable_fraction"] = largest_prunable_fraction(
            curve, baseline, tolerance)
    return results


# ----------------------------------------------------------------------------
# Report.

_TITLES = {
    "single_head_ablation": "Metric change when one head is removed",
    "keep_one_head": "Metric when only this head of the layer remains",
    "head_importance": "Head importance |dL/dmask|",
    "head_importance_normalized": "Head importance, L2-normalised per layer",
    "layer_ablation": "Metric change when one layer is skipped",
}
# Diverging colour maps (centred on 0) for changes, sequential for the rest.
_DIVERGING = {"single_head_ablation", "layer_ablation"}


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def _markdown_table(array: np.ndarray, row_label: str = "layer",
                    col_label: str = "head") -> str:
    array = np.atleast_2d(array)
    header = f"| {row_label} \\ {col_label} | " + " | ".join(
        str(h) for h in range(array.shape[1])) + " |"
    rule = "|---" * (array.shape[1] + 1) + "|"
    rows = [f"| {l} | " + " | ".join(_fmt(v) for v in row) + " |"
            for l, row in enumerate(array)]
    return "\n".join([header, rule, *rows])


def _heatmap(array: np.ndarray, path: str, title: str, *, diverging: bool,
             colorbar_label: str, xlabel: str | None = "head") -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    array = np.atleast_2d(np.asarray(array, np.float64))
    layers, heads = array.shape
    fig, ax = plt.subplots(figsize=(max(4.0, 0.7 * heads + 2.5),
                                    max(2.5, 0.5 * layers + 1.5)))
    if diverging:
        bound = float(np.abs(array).max()) or 1.0
        image = ax.imshow(array, cmap="RdBu", vmin=-bound, vmax=bound, aspect="auto")
    else:
        image = ax.imshow(array, cmap="viridis", aspect="auto")
    ax.set_xticks(range(heads) if xlabel else [])
    ax.set_yticks(range(layers))
    ax.set_xlabel(xlabel or "")
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=10)
    low, high = image.get_clim()
    for l in range(layers):
        for h in range(heads):
            value = array[l, h]
            if diverging:
                dark = abs(value) > 0.6 * max(abs(low), abs(high))
            else:
                dark = value < low + 0.5 * (high - low)
            ax.text(h, l, f"{value:.2g}", ha="center", va="center", fontsize=7,
                    color="white" if dark else "black")
    fig.colorbar(image, ax=ax, label=colorbar_label)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _pruning_plot(curve: Sequence[PruningStep], path: str, *, metric_name: str,
                  baseline: float | None, tolerance: float | None) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fractions = [100 * s[0] for s in curve]
    metrics = [s[2] for s in curve]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(fractions, metrics, marker="o", label="pruned by importance")
    if baseline is not None:
        ax.axhline(baseline, color="gray", linestyle="--", label="all heads")
        if tolerance is not None:
            ax.axhline(baseline - tolerance, color="red", linestyle=":",
                       label=f"baseline - {tolerance:g}")
    ax.set_xlabel("heads pruned (%)")
    ax.set_ylabel(metric_name)
    ax.set_title(f"{metric_name} vs fraction of heads pruned")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(results: Mapping[str, Any], directory: str, *,
                 metric_name: str) -> dict[str, str]:
    """Writes the results of `run_ablations` (or any subset of its keys) to
    `directory`: `results.json`, `report.md` (tables), one heatmap
    `<analysis>_<group>.png` per `[layers, heads]` score (annotated, with a
    colour bar), `layer_ablation_<group>.png` and `pruning_curve.png`.
    Returns name -> path of every file written.
    """
    os.makedirs(directory, exist_ok=True)
    written: dict[str, str] = {}
    baseline = results.get("baseline")
    tolerance = results.get("tolerance")

    path = os.path.join(directory, "results.json")
    with open(path, "w") as f:
        json.dump({"metric_name": metric_name, **jsonable(dict(results))}, f, indent=2)
    written["results.json"] = path

    lines = [f"# Head ablation report ({metric_name})", ""]
    if baseline is not None:
        lines += [f"Baseline (all heads): **{_fmt(baseline)}**", ""]
    for key, title in _TITLES.items():
        if key not in results:
            continue
        lines += [f"## {title}", ""]
        for group, array in results[key].items():
            array = np.asarray(array, np.float64)
            name = f"{key}_{group}.png"
            if array.ndim == 1:  # layer ablation: one row per layer
                table = _markdown_table(array[:, None], "layer", "change")
                _heatmap(array[:, None], os.path.join(directory, name),
                         f"{title}\n({group}, {metric_name})", diverging=True,
                         colorbar_label=f"{metric_name} change", xlabel=None)
            else:
                table = _markdown_table(array)
                label = (f"{metric_name} change" if key in _DIVERGING else
                         metric_name if key == "keep_one_head" else "importance")
                _heatmap(array, os.path.join(directory, name),
                         f"{title}\n({group}, {metric_name})",
                         diverging=key in _DIVERGING, colorbar_label=label)
            written[name] = os.path.join(directory, name)
            lines += [f"### {group}", "", f"![{key} {group}]({name})", "", table, ""]
    if "pruning_curve" in results:
        curve = [PruningStep(*s) if not isinstance(s, Mapping) else
                 PruningStep(s["fraction"], s["heads_remaining"], s["metric"])
                 for s in results["pruning_curve"]]
        name = "pruning_curve.png"
        _pruning_plot(curve, os.path.join(directory, name), metric_name=metric_name,
                      baseline=baseline, tolerance=tolerance)
        written[name] = os.path.join(directory, name)
        lines += ["## Iterative pruning", "", f"![pruning curve]({name})", "",
                  f"| pruned (%) | heads remaining | {metric_name} |", "|---|---|---|"]
        lines += [f"| {100 * s.fraction:.1f} | {s.heads_remaining} | {_fmt(s.metric)} |"
                  for s in curve]
        lines.append("")
        if "largest_prunable_fraction" in results:
            lines += [f"Largest fraction prunable within {_fmt(tolerance or 0.0)} of the "
                      f"baseline: **{100 * results['largest_prunable_fraction']:.1f}%**", ""]
    path = os.path.join(directory, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    written["report.md"] = path
    return written
