"""Attention-head and layer ablation, head importance and iterative pruning.

After Michel, Levy and Neubig (2019), "Are Sixteen Heads Really Better than
One?". Model-agnostic: the caller supplies `metric_fn(masks) -> float` (the
model with those masks on an evaluation set, higher is better) and
`loss_fn(masks) -> scalar` (differentiable; its gradient w.r.t. the masks gives
head importance). `masks` is a dict of arrays, one entry per group of heads:

  BERT                    {'head_mask': [layers, heads]} (+ 'layer_mask': [layers])
  translation Transformer {'encoder': [L, H], 'decoder_self': [L, H], 'cross': [L, H]}

`shapes` gives each group's `(layers, heads)` (`bert_shapes`,
`transformer_shapes`). A head mask entry multiplies that head's attention
probabilities (0 removes the head, see `bert_jax.modeling.attention`):

    results = run_ablations(metric_fn, loss_fn, bert_shapes(config),
                            num_layers=config.num_layers)
    write_report(results, "ablation_report", metric_name="accuracy")

Each module does one job: `masks` knows the head groups, their shapes and the
masks as the model's keyword arguments; `scores` holds the algorithms (one
head or layer removed, one head kept, head importance, iterative pruning,
`run_ablations`); `report` writes the results (`write_report`: JSON, Markdown
tables, heatmaps `[layers x heads]` and the pruning curve).
`launch/ablate.py` runs them on a trained checkpoint.
"""

from bert_jax.analysis.ablation.masks import (  # noqa: F401
    BERT_GROUP, LAYER_GROUP, TRANSFORMER_GROUPS, LossFn, Masks, MetricFn, Shapes,
    bert_shapes, model_kwargs, model_shapes, ones_masks, transformer_mask_kwargs,
    transformer_shapes)
from bert_jax.analysis.ablation.scores import (  # noqa: F401
    PruningStep, head_importance, iterative_pruning, keep_one_head, largest_prunable_fraction,
    layer_ablation, normalize_per_layer, run_ablations, single_head_ablation)
from bert_jax.analysis.ablation.report import write_report  # noqa: F401
