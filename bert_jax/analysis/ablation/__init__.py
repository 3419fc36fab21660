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

One job a module: `masks` (head groups, their shapes, masks as the model's
keyword arguments), `scores` (one head or layer removed, one head kept, head
importance, iterative pruning, `run_ablations`), `report` (`write_report`:
JSON, Markdown tables, heatmaps `[layers x heads]` and the pruning curve).
"""

from bert_jax.analysis.ablation.masks import (  # noqa: F401
    BERT_GROUP, LAYER_GROUP, TRANSFORMER_GROUPS, LossFn, Masks, MetricFn, Shapes,
    bert_shapes, model_kwargs, model_shapes, ones_masks, transformer_mask_kwargs,
    transformer_shapes)
from bert_jax.analysis.ablation.scores import (  # noqa: F401
    PruningStep, head_importance, iterative_pruning, keep_one_head, largest_prunable_fraction,
    layer_ablation, normalize_per_layer, run_ablations, single_head_ablation)
from bert_jax.analysis.ablation.report import write_report  # noqa: F401
