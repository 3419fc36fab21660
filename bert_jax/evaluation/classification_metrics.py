"""Metrics for fine-tuning: GLUE classification and regression, token tagging.

Everything here is plain numpy on host arrays (the model's outputs after
`jax.device_get` and an argmax), so the numbers are easy to check against the
references the field reports with:

- GLUE: accuracy, binary F1 of the positive class (MRPC, QQP), Matthews
  correlation (CoLA; sklearn's multi-class definition), Pearson and Spearman
  correlation (STS-B; `scipy.stats`).
- Token tagging: accuracy over labelled positions (padding and sub-word
  continuations carry the label `ignore`, -100 by the Hugging Face convention),
  and entity-level precision/recall/F1 for BIO tags (`seqeval`, whose default
  mode reads entities as conlleval does).

All scores are Python floats in [0, 1] (correlations in [-1, 1]), not
percentages. Mismatched or empty inputs raise a ValueError that names the
arguments and their shapes.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy import stats
from seqeval import metrics as seqeval_metrics


# --------------------------------------------------------------------------
# Input checks.

def _paired(a, b, a_name: str, b_name: str) -> tuple[np.ndarray, np.ndarray]:
    """`a` and `b` as flat arrays of equal, non-zero size (any equal shapes)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        raise ValueError(
            f"{a_name} has shape {a.shape} but {b_name} has shape {b.shape}; pass one "
            f"value per example in each (argmax the logits first for class predictions).")
    if a.size == 0:
        raise ValueError(f"{a_name} and {b_name} are empty (shape {a.shape}); "
                         "a metric needs at least one example.")
    return a.reshape(-1), b.reshape(-1)


# --------------------------------------------------------------------------
# Classification.

def accuracy(predictions, labels) -> float:
    """Fraction of examples whose predicted class equals the label.

    predictions, labels: `[examples]` class ids (any equal shapes are flattened).
    """
    predictions, labels = _paired(predictions, labels, "predictions", "labels")
    return float(np.mean(predictions == labels))


def f1(predictions, labels, positive=1) -> float:
    """Binary F1 of the `positive` class, as GLUE reports for MRPC and QQP.

    predictions, labels: `[examples]` class ids. F1 = 2·tp / (2·tp + fp + fn);
    0.0 when neither predictions nor labels contain the positive class
    (sklearn's `zero_division=0`).
    """
    predictions, labels = _paired(predictions, labels, "predictions", "labels")
    predicted, actual = predictions == positive, labels == positive
    true_positives = np.sum(predicted & actual)
    denominator = np.sum(predicted) + np.sum(actual)  # = 2·tp + fp + fn
    return float(2 * true_positives / denominator) if denominator else 0.0


def _confusion_matrix(predictions: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """`[classes, classes]` counts, rows = labels, columns = predictions."""
    classes, index = np.unique(np.concatenate([labels, predictions]), return_inverse=True)
    label_index, prediction_index = np.split(index.reshape(-1), 2)
    counts = np.zeros((len(classes), len(classes)), dtype=np.float64)
    np.add.at(counts, (label_index, prediction_index), 1)
    return counts


def matthews_corrcoef(predictions, labels) -> float:
    """Matthews correlation coefficient, binary or multi-class (CoLA's metric).

    predictions, labels: `[examples]` class ids. The multi-class form is
    Gorodkin's R_K, the same as `sklearn.metrics.matthews_corrcoef`:
    (c·s − Σ p_k t_k) / sqrt((s² − Σ p_k²)(s² − Σ t_k²)), with c correct
    predictions, s examples, p_k / t_k the predicted / true counts of class k.
    0.0 when undefined (all labels, or all predictions, one class).
    """
    predictions, labels = _paired(predictions, labels, "predictions", "labels")
    counts = _confusion_matrix(predictions, labels)
    true_per_class, predicted_per_class = counts.sum(axis=1), counts.sum(axis=0)
    correct, total = np.trace(counts), counts.sum()
    covariance = correct * total - true_per_class @ predicted_per_class
    variance_predicted = total**2 - predicted_per_class @ predicted_per_class
    variance_true = total**2 - true_per_class @ true_per_class
    if variance_predicted * variance_true == 0:
        return 0.0
    return float(covariance / np.sqrt(variance_predicted * variance_true))


# --------------------------------------------------------------------------
# Regression (correlations).

def pearson(predictions, targets) -> float:
    """Pearson correlation coefficient (STS-B), in [-1, 1] (`scipy.stats.pearsonr`).

    predictions, targets: `[examples]` real values. NaN when either input is
    constant (the correlation is undefined), so a collapsed model shows up as
    NaN rather than a plausible number.
    """
    predictions, targets = _paired(predictions, targets, "predictions", "targets")
    return _correlation(stats.pearsonr, predictions, targets)


def spearman(predictions, targets) -> float:
    """Spearman rank correlation (STS-B), ties at their average rank
    (`scipy.stats.spearmanr`).

    predictions, targets: `[examples]` real values. NaN when either input is
    constant.
    """
    predictions, targets = _paired(predictions, targets, "predictions", "targets")
    return _correlation(stats.spearmanr, predictions, targets)


def _correlation(function, x: np.ndarray, y: np.ndarray) -> float:
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")   # undefined; scipy would warn and give NaN too
    return float(function(x.astype(np.float64), y.astype(np.float64))[0])


# --------------------------------------------------------------------------
# Token tagging.

def tagging_accuracy(predictions, labels, ignore=-100) -> float:
    """Accuracy over the tokens whose label is not `ignore`.

    predictions, labels: `[batch, length]` tag ids (any equal shapes; they are
    flattened). Positions labelled `ignore` (padding, special tokens, sub-word
    continuations) do not count.
    """
    predictions, labels = _paired(predictions, labels, "predictions", "labels")
    counted = labels != ignore
    if not counted.any():
        raise ValueError(f"every label equals ignore={ignore!r} (shape {labels.shape}); "
                         "there is no token to score.")
    return float(np.mean(predictions[counted] == labels[counted]))


def is_bio(tags: Sequence[str]) -> bool:
    """Whether every tag is `O`, `B-TYPE` or `I-TYPE` (entity tags)."""
    return all(tag == "O" or tag[:2] in ("B-", "I-") for tag in tags)


def _check_bio(tags: Sequence[str], where: str) -> None:
    for position, tag in enumerate(tags):
        if tag != "O" and tag[:2] not in ("B-", "I-"):
            raise ValueError(f"{where}, token {position}: tag {tag!r} is not BIO; use 'O', "
                             "'B-TYPE' or 'I-TYPE' (convert IOBES or other schemes to BIO "
                             "first).")


def entity_f1(predicted_tags: Sequence[Sequence[str]],
              gold_tags: Sequence[Sequence[str]]) -> dict[str, float]:
    """Entity-level precision, recall and F1 for BIO tagging (CoNLL NER style),
    by `seqeval` (micro average, its default conlleval-compatible mode: a
    stray I-X starts an entity).

    predicted_tags, gold_tags: `[sentences][tokens]` string tags ('B-PER',
    'I-PER', 'O'). An entity counts as correct only if its type, start and end
    all match a gold entity. Scores are fractions in [0, 1]; each is 0.0 when
    its denominator is zero.
    """
    if len(predicted_tags) != len(gold_tags):
        raise ValueError(f"predicted_tags has {len(predicted_tags)} sentences but gold_tags "
                         f"has {len(gold_tags)}; pass the same sentences in the same order.")
    if not gold_tags:
        raise ValueError("predicted_tags and gold_tags are empty; pass at least one sentence.")
    for index, (predicted, gold) in enumerate(zip(predicted_tags, gold_tags)):
        if len(predicted) != len(gold):
            raise ValueError(f"sentence {index}: predicted_tags has {len(predicted)} "
                             f"tags but gold_tags has {len(gold)}; tag every token once.")
        _check_bio(predicted, f"predicted_tags[{index}]")
        _check_bio(gold, f"gold_tags[{index}]")
    gold_tags, predicted_tags = list(map(list, gold_tags)), list(map(list, predicted_tags))
    return {name: float(score(gold_tags, predicted_tags, zero_division=0))
            for name, score in (("precision", seqeval_metrics.precision_score),
                                ("recall", seqeval_metrics.recall_score),
                                ("f1", seqeval_metrics.f1_score))}
