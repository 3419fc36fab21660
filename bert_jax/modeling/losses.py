"""The losses of the tasks, as weighted sums so that padding never counts.

`cross_entropy_sums` and `bert_pretraining_sums` return dicts of float32
scalars summed over the batch (the loss, the unsmoothed negative
log-likelihood, the argmax hits and the weight sum) rather than means. The
train step (`bert_jax.training.train_step`) sums them over the whole batch and
every micro-batch and divides by the total weight only at the end
(`sums_to_means`), so a padding position, of weight 0, changes nothing and
gradient accumulation equals one large batch.

`cross_entropy_sums` takes logits `[..., classes]`, int labels `[...]` and
weights `[...]` (the translation and fine-tuning tasks); `bert_pretraining_sums`
combines the masked-LM (`[batch, predictions, vocab]`) and next-sentence
(`[batch, 2]`) losses of BERT pretraining.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def cross_entropy_sums(logits: jax.Array, labels: jax.Array, weights: jax.Array,
                       label_smoothing: float = 0.0) -> dict[str, jax.Array]:
    """Sums over weighted positions.

    Args:
      logits: `[..., classes]` (any float dtype; computed in float32).
      labels: `[...]` int class ids.
      weights: `[...]`, 0 for padding.
      label_smoothing: mass spread uniformly over all classes (Szegedy et al.).

    Returns:
      loss (the smoothed loss that is minimised), nll (unsmoothed negative
      log-likelihood), accuracy (argmax hits) and weight, each summed; a metric
      is its sum divided by the weight sum.
    """
    logits = logits.astype(jnp.float32)
    weights = weights.astype(jnp.float32)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]
    if label_smoothing:
        smooth = -log_probs.mean(axis=-1)
        loss = (1.0 - label_smoothing) * nll + label_smoothing * smooth
    else:
        loss = nll
    correct = (logits.argmax(axis=-1) == labels).astype(jnp.float32)
    return {"loss": (loss * weights).sum(), "nll": (nll * weights).sum(),
            "accuracy": (correct * weights).sum(), "weight": weights.sum()}


def sums_to_means(sums: dict[str, jax.Array], weight: jax.Array) -> dict[str, jax.Array]:
    """Metric sums -> means: a sum `<group>_<name>` is divided by the sum
    `<group>_weight` when there is one (e.g. per-sequence `nsp_*` metrics next
    to per-token ones), every other sum by `weight`. Weight sums are dropped."""
    groups = {key[:-len("_weight")]: value for key, value in sums.items()
              if key.endswith("_weight")}
    return {key: value / jnp.maximum(groups.get(key.split("_")[0], weight), 1e-9)
            for key, value in sums.items() if not key.endswith("_weight")}


def bert_pretraining_sums(mlm_logits: jax.Array, nsp_logits: jax.Array,
                          batch: dict[str, jax.Array],
                          sequence_weights: jax.Array | None = None,
                          next_sentence: bool = True) -> dict[str, jax.Array]:
    """The BERT pretraining loss as sums: `loss / weight` is the mean masked-LM
    cross-entropy plus the mean next-sentence cross-entropy (google-research/bert
    and Hugging Face `BertForPreTraining` alike); the masked-LM one alone with
    `next_sentence=False` (then `nsp_logits` and the labels are not read).

    Args:
      mlm_logits: `[batch, predictions, vocab]` at `batch['masked_lm_positions']`.
      nsp_logits: `[batch, 2]`.
      batch: `masked_lm_ids`, `masked_lm_weights` `[batch, predictions]` (weight
        0 for unused prediction slots) and `next_sentence_labels` `[batch]`.
      sequence_weights: `[batch]`, 0 for padding rows (all ones by default).
      next_sentence: whether the next-sentence loss and metrics are in.

    Returns:
      loss and weight (the masked tokens); `mlm_nll`, `mlm_accuracy` (per
      masked token once divided by the weight); `nsp_nll`, `nsp_accuracy` and
      their own `nsp_weight` (the sequences), with `next_sentence`; see
      `sums_to_means`.
    """
    mlm = cross_entropy_sums(mlm_logits, batch["masked_lm_ids"],
                             batch["masked_lm_weights"])
    if not next_sentence:
        return {"loss": mlm["loss"], "weight": mlm["weight"], "mlm_nll": mlm["nll"],
                "mlm_accuracy": mlm["accuracy"]}
    labels = batch["next_sentence_labels"]
    if sequence_weights is None:
        sequence_weights = jnp.ones(labels.shape, jnp.float32)
    nsp = cross_entropy_sums(nsp_logits, labels, sequence_weights)
    per_sequence = mlm["weight"] / jnp.maximum(nsp["weight"], 1e-9)
    return {"loss": mlm["loss"] + nsp["loss"] * per_sequence, "weight": mlm["weight"],
            "mlm_nll": mlm["nll"], "mlm_accuracy": mlm["accuracy"],
            "nsp_nll": nsp["nll"], "nsp_accuracy": nsp["accuracy"],
            "nsp_weight": nsp["weight"]}
