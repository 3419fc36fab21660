"""SQuAD v1.1 evaluation and the span search of extractive question answering.

The scoring reproduces the official `evaluate-v1.1.py` in behaviour
(normalisation, exact match, token F1, the maximum over gold answers,
percentages): the tests score the BERT ensemble's leaderboard predictions EM
86.2 / F1 92.2 on dev. Departures: unanswered questions are one logged warning,
and a file of another version is refused. `best_spans` is google-research/bert
`run_squad.py`'s n-best span search on one window's logits.

    python -m bert_jax.evaluation.squad dev-v1.1.json predictions.json
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import re
import string
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np

from bert_jax.errors import DataError

EXPECTED_VERSION = "1.1"
_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")

log = logging.getLogger(__name__)


def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation, then a/an/the, collapse spaces (the official
    order): `normalize_answer("The  Denver Broncos!")` is `"denver broncos"`."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match_score(prediction: str, ground_truth: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(ground_truth)


def f1_score(prediction: str, ground_truth: str) -> float:
    prediction_tokens = normalize_answer(prediction).split()
    ground_truth_tokens = normalize_answer(ground_truth).split()
    common = collections.Counter(prediction_tokens) & collections.Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(prediction_tokens)
    recall = num_same / len(ground_truth_tokens)
    return 2 * precision * recall / (precision + recall)


def metric_max_over_ground_truths(metric_fn: Callable[[str, str], float], prediction: str,
                                  ground_truths: Sequence[str]) -> float:
    return max(metric_fn(prediction, ground_truth) for ground_truth in ground_truths)


def evaluate(dataset: Sequence[Mapping[str, Any]],
             predictions: Mapping[str, str]) -> dict[str, float]:
    """Exact match and F1, in percent, over every question of `dataset` (a SQuAD
    file's `data` list); `predictions`: `{question_id: answer_text}`. A question
    without a prediction scores 0; unknown ids are ignored (as the official script)."""
    exact_match = f1 = 0.0
    total = 0
    missing: list[str] = []
    for article in dataset:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                total += 1
                if qa["id"] not in predictions:
                    missing.append(qa["id"])
                    continue
                ground_truths = [answer["text"] for answer in qa["answers"]]
                prediction = predictions[qa["id"]]
                exact_match += metric_max_over_ground_truths(
                    exact_match_score, prediction, ground_truths)
                f1 += metric_max_over_ground_truths(f1_score, prediction, ground_truths)
    if total == 0:
        raise ValueError("dataset holds no questions: pass a SQuAD file's `data` list.")
    if missing:
        log.warning("%d of %d questions have no prediction and score 0 (first: %s).",
                    len(missing), total, ", ".join(missing[:5]))
    return {"exact_match": 100.0 * exact_match / total, "f1": 100.0 * f1 / total}


def load_dataset(path: str) -> list[dict[str, Any]]:
    """The `data` list of a SQuAD v1.1 JSON file, else a `DataError` naming the file
    (2.0's unanswerable questions are handled neither here nor by the windows)."""
    with open(path, encoding="utf-8") as f:
        try:
            contents = json.load(f)
        except json.JSONDecodeError as e:
            raise DataError(path, f"not valid JSON ({e.msg})", "pass a SQuAD dataset file",
                            line=e.lineno, column=e.colno) from e
    if not isinstance(contents, dict) or "data" not in contents:
        raise DataError(path, "no top-level 'data' list", "pass a SQuAD dataset file")
    version = contents.get("version")
    if version != EXPECTED_VERSION:
        raise DataError(path, f"SQuAD version {version!r}", f"pass a v{EXPECTED_VERSION} file")
    return contents["data"]


def load_predictions(path: str) -> dict[str, str]:
    with open(path, encoding="utf-8") as f:
        predictions = json.load(f)
    if not isinstance(predictions, dict):
        raise ValueError(f"{path} holds a JSON {type(predictions).__name__}: give an object "
                         "{question id: answer text}.")
    return predictions


class Span(NamedTuple):
    """A candidate answer: tokens `start..end` inclusive of one window."""
    start: int
    end: int
    score: float  # start_logit + end_logit


def _top_indices(logits: np.ndarray, valid: np.ndarray, k: int) -> np.ndarray:
    candidates = np.flatnonzero(valid)
    order = np.argsort(-logits[candidates], kind="stable")
    return candidates[order[:k]]


def best_spans(start_logits, end_logits, *, n_best: int, max_answer_length: int,
               valid) -> list[Span]:
    """The `n_best` best answer spans of one window, best first.

    start_logits, end_logits, valid: `[length]` (valid: True on context tokens).
    As google-research/bert `run_squad.py`: pairs of the `n_best` largest start
    and end logits with start <= end < start + max_answer_length, by
    start_logit + end_logit; but the top-k is over valid tokens only, so the
    question and padding use up no slots. It may return fewer than `n_best`.
    """
    start_logits, end_logits = np.asarray(start_logits), np.asarray(end_logits)
    valid = np.asarray(valid, dtype=bool)
    if not (start_logits.ndim == 1 and start_logits.shape == end_logits.shape == valid.shape):
        raise ValueError(f"start_logits {start_logits.shape}, end_logits {end_logits.shape} "
                         f"and valid {valid.shape} must all be [length] for one window.")
    if n_best < 1 or max_answer_length < 1:
        raise ValueError(f"n_best={n_best}, max_answer_length={max_answer_length}: "
                         "both must be at least 1.")
    spans = [Span(int(start), int(end), float(start_logits[start] + end_logits[end]))
             for start in _top_indices(start_logits, valid, n_best)
             for end in _top_indices(end_logits, valid, n_best)
             if start <= end < start + max_answer_length]
    spans.sort(key=lambda span: (-span.score, span.start, span.end))
    return spans[:n_best]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=f"Official SQuAD v{EXPECTED_VERSION} evaluation (exact match and F1).")
    parser.add_argument("dataset_file", help="SQuAD v1.1 dataset JSON, e.g. dev-v1.1.json")
    parser.add_argument("prediction_file", help="JSON object {question_id: answer_text}")
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(levelname)s: %(message)s")
    result = evaluate(load_dataset(args.dataset_file), load_predictions(args.prediction_file))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
