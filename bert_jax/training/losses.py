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
