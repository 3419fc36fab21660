"""Metrics for fine-tuning: GLUE classification and regression, token tagging.

The metrics are plain numpy on host arrays, checked against the references
the field reports with: accuracy, binary F1 (MRPC, QQP), Matthews correlation
(CoLA; sklearn's multi-class definition), Pearson and Spearman (STS-B;
`scipy.stats`); tagging accuracy over labelled positions (`ignore`, -100 as
Hugging Face) and entity F1 of BIO tags (`seqeval`, read as conlleval does).
The classification and regression metrics take predictions and labels of the
same shape, one class id or score per example (`[examples]`; other equal
shapes are flattened); `entity_f1` takes lists of tag sequences
`[sentences][tokens]`. Scores are fractions, not percentages (the evaluators
of `evaluators` and the probe of `bert_jax.analysis.features` call these).
Mismatched or empty inputs raise a ValueError naming them.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy import stats
from seqeval import metrics as seqeval_metrics


def _paired(a, b, a_name: str, b_name: str) -> tuple[np.ndarray, np.ndarray]:
    """`a` and `b` as flat arrays of equal, non-zero size (any equal shapes)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        raise ValueError(f"{a_name} has shape {a.shape} but {b_name} {b.shape}; pass one "
                         "value per example in each.")
    if a.size == 0:
        raise ValueError(f"{a_name} and {b_name} are empty; pass at least one example.")
    return a.reshape(-1), b.reshape(-1)


def accuracy(predictions, labels) -> float:
    """predictions, labels: `[examples]` class ids (equal shapes are flattened)."""
    predictions, labels = _paired(predictions, labels, "predictions", "labels")
    return float(np.mean(predictions == labels))


def f1(predictions, labels, positive=1) -> float:
    """Binary F1 of the `positive` class (GLUE's MRPC, QQP); 0.0 when neither
    side has it (sklearn's `zero_division=0`)."""
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
    """Matthews correlation (CoLA), multi-class as Gorodkin's R_K (sklearn's):
    (c·s − Σ p_k t_k) / sqrt((s² − Σ p_k²)(s² − Σ t_k²)), with c correct
    predictions, s examples, p_k / t_k the predicted / true counts of class k.
    0.0 when undefined (all labels, or all predictions, one class)."""
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


def pearson(predictions, targets) -> float:
    """Pearson correlation (STS-B); NaN when either input is constant, so a
    collapsed model shows as NaN, not a plausible number."""
    predictions, targets = _paired(predictions, targets, "predictions", "targets")
    return _correlation(stats.pearsonr, predictions, targets)


def spearman(predictions, targets) -> float:
    """Spearman rank correlation (STS-B), ties at their average rank; NaN when
    either input is constant."""
    predictions, targets = _paired(predictions, targets, "predictions", "targets")
    return _correlation(stats.spearmanr, predictions, targets)


def _correlation(function, x: np.ndarray, y: np.ndarray) -> float:
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")   # undefined; scipy would warn and give NaN too
    return float(function(x.astype(np.float64), y.astype(np.float64))[0])


def tagging_accuracy(predictions, labels, ignore=-100) -> float:
    """Accuracy over the tokens whose label is not `ignore` (padding, special
    tokens, continuations); predictions, labels: `[batch, length]` tag ids."""
    predictions, labels = _paired(predictions, labels, "predictions", "labels")
    counted = labels != ignore
    if not counted.any():
        raise ValueError(f"every label is ignore={ignore!r}: no token to score.")
    return float(np.mean(predictions[counted] == labels[counted]))


def is_bio(tags: Sequence[str]) -> bool:
    return all(tag == "O" or tag[:2] in ("B-", "I-") for tag in tags)


def _check_bio(tags: Sequence[str], where: str) -> None:
    for position, tag in enumerate(tags):
        if tag != "O" and tag[:2] not in ("B-", "I-"):
            raise ValueError(f"{where}, token {position}: tag {tag!r} is not BIO ('O', "
                             "'B-TYPE', 'I-TYPE').")


def entity_f1(predicted_tags: Sequence[Sequence[str]],
              gold_tags: Sequence[Sequence[str]]) -> dict[str, float]:
    """Entity precision, recall and F1 of BIO tags `[sentences][tokens]` by
    `seqeval` (micro average, conlleval's mode: a stray I-X starts an entity);
    an entity is right when type, start and end match; 0.0 for a zero denominator."""
    if len(predicted_tags) != len(gold_tags):
        raise ValueError(f"predicted_tags has {len(predicted_tags)} sentences, gold_tags "
                         f"{len(gold_tags)}; pass the same sentences.")
    if not gold_tags:
        raise ValueError("predicted_tags and gold_tags are empty; pass at least one sentence.")
    for index, (predicted, gold) in enumerate(zip(predicted_tags, gold_tags)):
        if len(predicted) != len(gold):
            raise ValueError(f"sentence {index}: {len(predicted)} predicted tags, "
                             f"{len(gold)} gold; tag every token once.")
        _check_bio(predicted, f"predicted_tags[{index}]")
        _check_bio(gold, f"gold_tags[{index}]")
    gold_tags, predicted_tags = list(map(list, gold_tags)), list(map(list, predicted_tags))
    return {name: float(score(gold_tags, predicted_tags, zero_division=0))
            for name, score in (("precision", seqeval_metrics.precision_score),
                                ("recall", seqeval_metrics.recall_score),
                                ("f1", seqeval_metrics.f1_score))}
