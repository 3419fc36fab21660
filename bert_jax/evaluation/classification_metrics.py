"""Metrics for fine-tuning: GLUE classification and regression, token tagging.

Everything here is plain numpy on host arrays (the model's outputs after
`jax.device_get` and an argmax), so the numbers are easy to check against the
references the field reports with:

- GLUE: accuracy, binary F1 of the positive class (MRPC, QQP), Matthews
  correlation (CoLA; sklearn's multi-class definition), Pearson and Spearman
  correlation (STS-B; Spearman with average ranks for ties, as
  `scipy.stats.spearmanr`).
- Token tagging: accuracy over labelled positions (padding and sub-word
  continuations carry the label `ignore`, -100 by the Hugging Face convention),
  and entity-level precision/recall/F1 for BIO tags, with entities read the way
  conlleval and seqeval's default mode read them.

All scores are Python floats in [0, 1] (correlations in [-1, 1]), not
percentages. Mismatched or empty inputs raise a ValueError that names the
arguments and their shapes.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np


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
    """Pearson correlation coefficient (STS-B), in [-1, 1].

    predictions, targets: `[examples]` real values. NaN when either input is
    constant (the correlation is undefined; `scipy.stats.pearsonr` also gives
    NaN), so a collapsed model shows up as NaN rather than a plausible number.
    """
    predictions, targets = _paired(predictions, targets, "predictions", "targets")
    x = predictions.astype(np.float64) - np.mean(predictions, dtype=np.float64)
    y = targets.astype(np.float64) - np.mean(targets, dtype=np.float64)
    norm = np.sqrt((x @ x) * (y @ y))
    if norm == 0:
        return float("nan")
    return float(np.clip((x @ y) / norm, -1.0, 1.0))


def average_ranks(values) -> np.ndarray:
    """1-based ranks of `[n]` values, tied values sharing their average rank.

    The same as `scipy.stats.rankdata(values, method="average")`:
    `average_ranks([10, 20, 20, 30]) == [1, 2.5, 2.5, 4]`.
    """
    values = np.asarray(values).reshape(-1)
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    # Each run of equal values is one group; its members get the group's mean rank.
    starts_group = np.concatenate([[True], sorted_values[1:] != sorted_values[:-1]])
    group = np.cumsum(starts_group) - 1
    first = np.flatnonzero(starts_group)                 # 0-based first position per group
    last = np.append(first[1:], len(values)) - 1         # 0-based last position per group
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = (first[group] + last[group]) / 2 + 1
    return ranks


def spearman(predictions, targets) -> float:
    """Spearman rank correlation (STS-B): Pearson of the average ranks.

    predictions, targets: `[examples]` real values; ties get their average rank,
    as in `scipy.stats.spearmanr`. NaN when either input is constant.
    """
    predictions, targets = _paired(predictions, targets, "predictions", "targets")
    return pearson(average_ranks(predictions), average_ranks(targets))


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


class Entity(NamedTuple):
    """One entity of a tagged sentence: tokens `start..end` inclusive."""
    type: str
    start: int
    end: int


def _split_tag(tag: str, where: str) -> tuple[str, str]:
    """'B-PER' -> ('B', 'PER'); 'O' -> ('O', '')."""
    if tag == "O":
        return "O", ""
    prefix, _, entity_type = tag.partition("-")
    if prefix not in ("B", "I"):
        raise ValueError(f"{where}: tag {tag!r} is not BIO; use 'O', 'B-TYPE' or 'I-TYPE' "
                         "(convert IOBES or other schemes to BIO first).")
    return prefix, entity_type


def bio_entities(tags: Sequence[str], where: str = "tags") -> list[Entity]:
    """The entities of one sentence of BIO tags, read as conlleval does.

    An entity starts at B-X, or at I-X not continuing an entity of type X (so
    a stray I- starts a new entity); it ends before O, before B-, or before an
    I- of another type. `bio_entities(['I-PER', 'I-LOC', 'O', 'B-ORG'])` is
    `[('PER', 0, 0), ('LOC', 1, 1), ('ORG', 3, 3)]`.
    """
    entities: list[Entity] = []
    current_type, start = None, 0
    for position, tag in enumerate(tags):
        prefix, entity_type = _split_tag(tag, f"{where}, token {position}")
        continues = prefix == "I" and entity_type == current_type
        if current_type is not None and not continues:
            entities.append(Entity(current_type, start, position - 1))
            current_type = None
        if prefix != "O" and not continues:
            current_type, start = entity_type, position
    if current_type is not None:
        entities.append(Entity(current_type, start, len(tags) - 1))
    return entities


def _ratio(numerator: int, denominator: int) -> float:
    return numerator / denominator if denominator else 0.0


def entity_f1(predicted_tags: Sequence[Sequence[str]],
              gold_tags: Sequence[Sequence[str]]) -> dict[str, float]:
    """Entity-level precision, recall and F1 for BIO tagging (CoNLL NER style).

    predicted_tags, gold_tags: `[sentences][tokens]` string tags ('B-PER',
    'I-PER', 'O'). An entity counts as correct only if its type, start and end
    all match a gold entity. Scores are fractions in [0, 1]; each is 0.0 when
    its denominator is zero (as seqeval).
    """
    if len(predicted_tags) != len(gold_tags):
        raise ValueError(f"predicted_tags has {len(predicted_tags)} sentences but gold_tags "
                         f"has {len(gold_tags)}; pass the same sentences in the same order.")
    if not gold_tags:
        raise ValueError("predicted_tags and gold_tags are empty; pass at least one sentence.")
    predicted, gold = set(), set()
    for index, (sentence_predicted, sentence_gold) in enumerate(zip(predicted_tags, gold_tags)):
        if len(sentence_predicted) != len(sentence_gold):
            raise ValueError(f"sentence {index}: predicted_tags has {len(sentence_predicted)} "
                             f"tags but gold_tags has {len(sentence_gold)}; tag every token once.")
        predicted.update((index, *e) for e in bio_entities(sentence_predicted,
                                                           f"predicted_tags[{index}]"))
        gold.update((index, *e) for e in bio_entities(sentence_gold, f"gold_tags[{index}]"))
    correct = len(predicted & gold)
    precision, recall = _ratio(correct, len(predicted)), _ratio(correct, len(gold))
    return {"precision": precision, "recall": recall,
            "f1": _ratio(2 * precision * recall, precision + recall)}
