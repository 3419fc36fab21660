"""Weighted cross-entropy returning sums, so padding never counts."""

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


def bert_pretraining_sums(mlm_logits: jax.Array, nsp_logits: jax.Array,
                          batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """The BERT pretraining loss as sums: `loss / weight` is the mean masked-LM
    cross-entropy plus the mean next-sentence cross-entropy (google-research/bert
    and Hugging Face `BertForPreTraining` alike).

    Args:
      mlm_logits: `[batch, predictions, vocab]` at `batch['masked_lm_positions']`.
      nsp_logits: `[batch, 2]`.
      batch: `masked_lm_ids`, `masked_lm_weights` `[batch, predictions]` (weight
        0 for unused prediction slots) and `next_sentence_labels` `[batch]`.

    Returns:
      loss and weight (the masked tokens), plus `mlm_nll`, `mlm_accuracy`
      (per masked token once divided by the weight) and `nsp_nll`,
      `nsp_accuracy` (scaled so that dividing by the weight gives the
      per-sequence mean).
    """
    mlm = cross_entropy_sums(mlm_logits, batch["masked_lm_ids"],
                             batch["masked_lm_weights"])
    labels = batch["next_sentence_labels"]
    nsp = cross_entropy_sums(nsp_logits, labels, jnp.ones(labels.shape, jnp.float32))
    per_sequence = mlm["weight"] / nsp["weight"]  # turns NSP sums into weight units
    return {"loss": mlm["loss"] + nsp["loss"] * per_sequence, "weight": mlm["weight"],
            "mlm_nll": mlm["nll"], "mlm_accuracy": mlm["accuracy"],
            "nsp_nll": nsp["nll"] * per_sequence,
            "nsp_accuracy": nsp["accuracy"] * per_sequence}
