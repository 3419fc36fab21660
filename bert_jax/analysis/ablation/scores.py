"""The ablation algorithms of Michel, Levy and Neubig (2019). The model is reached
only through the caller's `metric_fn(masks) -> float` and
`loss_fn(masks) -> scalar` (see the package docstring), where `masks` maps
each head group to a float32 `[layers, heads]` array.

`single_head_ablation` (one head removed) and `keep_one_head` (one head of a
layer kept) return group -> `[layers, heads]` of metrics or metric changes;
`layer_ablation` (one layer skipped) returns group -> `[layers]`;
`head_importance` returns group -> float64 `[layers, heads]` of `|dL/dmask|`
(the paper's section 4.1); `iterative_pruning` removes the least important
heads step by step and returns the pruning curve, a list of `PruningStep`s
(section 4.2). `run_ablations` runs them all and returns the results dict that
`report.write_report` writes.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.analysis.ablation.masks import (
    LAYER_GROUP, LossFn, MetricFn, Shapes, check_shapes, ones_masks)


class PruningStep(NamedTuple):
    """One point of a pruning curve: the fraction of all heads pruned, the
    number of heads that remain, and the metric with those heads."""

    fraction: float
    heads_remaining: int
    metric: float


def _as_float(value: Any) -> float:
    return float(np.asarray(value))


def single_head_ablation(metric_fn: MetricFn, shape_by_group: Shapes, *,
                         baseline: float | None = None) -> dict[str, np.ndarray]:
    """The metric change when each head alone is removed.

    Returns group -> `[layers, heads]` of `metric(head removed) - metric(all
    heads)` (negative: the head helps). `baseline`, the metric with all ones,
    is computed when not given. `metric_fn` runs `1 + total heads` times.
    """
    shapes = check_shapes(shape_by_group)
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

    return _per_head_metric(metric_fn, check_shapes(shape_by_group), keep_only)


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
    shapes = check_shapes(shapes)
    point = ones_masks(shapes) if at is None else {
        g: np.asarray(at[g], np.float32) for g in shapes}
    point = {g: jnp.asarray(m) for g, m in point.items()}
    grad_fn = jax.grad(lambda m, b: jnp.asarray(loss_fn(m, *b), jnp.float32))
    scores = {g: np.zeros(s) for g, s in shapes.items()}
    empty = True
    for batch in [()] if batches is None else ((b,) for b in batches):
        grads = grad_fn(point, batch)
        for g in shapes:
            scores[g] += np.abs(np.asarray(grads[g], np.float64))
        empty = False
    if empty:
        raise ValueError("batches is empty.")
    if normalize:
        scores = {g: normalize_per_layer(s) for g, s in scores.items()}
    return scores


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
    shapes = check_shapes(shapes)
    if not 0.0 < fraction_per_step <= 1.0:
        raise ValueError(f"fraction_per_step={fraction_per_step}: must be in (0, 1].")
    total = sum(l * h for l, h in shapes.values())
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
    shapes = check_shapes(shapes)
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
