"""Fine-tuning metrics: GLUE classification/regression, token tagging, SQuAD v1.1.

Each metric is checked against hand-worked cases (the arithmetic is in the
comments) and, where sklearn is installed, the classification ones against it
on random data (Pearson/Spearman come from scipy.stats and entity F1 from
seqeval; the hand-worked cases check how they are called). The SQuAD evaluator
must reproduce the published EM 86.2 / F1 92.2 of the BERT ensemble's
leaderboard predictions on the real development set.
"""

from __future__ import annotations

import itertools
import json
import logging
import math

import numpy as np
import pytest

from bert_jax.evaluation import classification_metrics as cm
from bert_jax.evaluation import squad


# --------------------------------------------------------------------------
# Classification and regression: hand-worked cases.

def test_accuracy_and_binary_f1_by_hand():
    predictions, labels = [1, 1, 0, 0, 1], [1, 0, 1, 0, 1]
    # Matches at positions 0, 3, 4 -> 3/5.
    assert cm.accuracy(predictions, labels) == pytest.approx(0.6)
    # tp=2 (0, 4), fp=1 (1), fn=1 (2): F1 = 2*2 / (2*2 + 1 + 1) = 2/3.
    assert cm.f1(predictions, labels) == pytest.approx(2 / 3)
    # Class 0 as the positive class: tp=1 (3), fp=1 (2), fn=1 (1): 2 / 4.
    assert cm.f1(predictions, labels, positive=0) == pytest.approx(0.5)
    # No positive anywhere: 0.0, as sklearn with zero_division=0.
    assert cm.f1([0, 0], [0, 0]) == 0.0


def test_matthews_by_hand():
    # Binary, tp=2, tn=1, fp=1, fn=1: (2*1 - 1*1) / sqrt(3*3*2*2) = 1/6.
    assert cm.matthews_corrcoef([1, 1, 0, 0, 1], [1, 0, 1, 0, 1]) == pytest.approx(1 / 6)
    # Three classes, each predicted right once and wrong once: correct c=3,
    # s=6, true and predicted counts (2, 2, 2):
    # (3*6 - 12) / sqrt((36 - 12) * (36 - 12)) = 6 / 24.
    assert cm.matthews_corrcoef([0, 1, 1, 2, 2, 0], [0, 0, 1, 1, 2, 2]) == pytest.approx(0.25)
    # Labels need not be integers.
    assert cm.matthews_corrcoef(["a", "b"], ["a", "b"]) == pytest.approx(1.0)
    # Undefined (one class predicted) is 0.0.
    assert cm.matthews_corrcoef([1, 1, 1], [0, 1, 0]) == 0.0


def test_correlations_by_hand():
    # x - mean = (-1, 0, 1), y - mean = (-5/3, -2/3, 7/3): r = 4 / sqrt(2 * 26/3) = sqrt(12/13).
    assert cm.pearson([1, 2, 3], [1, 2, 5]) == pytest.approx(math.sqrt(12 / 13))
    assert cm.pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(cm.pearson([1, 1, 1], [1, 2, 3]))   # constant: undefined


def test_spearman_ties_by_hand():
    # Ranks (1, 2.5, 2.5, 4) and (1, 3, 2, 4): centred (-1.5, 0, 0, 1.5) and
    # (-1.5, .5, -.5, 1.5); r = 4.5 / sqrt(4.5 * 5) = sqrt(0.9).
    assert cm.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(math.sqrt(0.9))
    # Monotone but non-linear: rank correlation 1.
    assert cm.spearman([1, 2, 3, 4], [1, 8, 27, 64]) == pytest.approx(1.0)
    assert math.isnan(cm.spearman([2, 2, 2], [1, 2, 3]))   # constant: undefined


# --------------------------------------------------------------------------
# Classification and regression: against scipy and sklearn on random data.

@pytest.mark.parametrize("seed", range(3))
def test_classification_matches_sklearn(seed):
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, 200)
    predictions = np.where(rng.random(200) < 0.7, labels, 1 - labels)
    assert cm.accuracy(predictions, labels) == pytest.approx(
        metrics.accuracy_score(labels, predictions))
    assert cm.f1(predictions, labels) == pytest.approx(metrics.f1_score(labels, predictions))
    assert cm.matthews_corrcoef(predictions, labels) == pytest.approx(
        metrics.matthews_corrcoef(labels, predictions))
    labels3 = rng.integers(0, 3, 200)
    predictions3 = np.where(rng.random(200) < 0.5, labels3, rng.integers(0, 3, 200))
    assert cm.matthews_corrcoef(predictions3, labels3) == pytest.approx(
        metrics.matthews_corrcoef(labels3, predictions3))


@pytest.mark.parametrize("metric", [cm.accuracy, cm.f1, cm.matthews_corrcoef,
                                    cm.pearson, cm.spearman, cm.tagging_accuracy])
def test_bad_inputs_are_refused_clearly(metric):
    with pytest.raises(ValueError, match=r"\(3,\).*\(4,\)"):
        metric([1, 0, 1], [1, 0, 1, 1])
    with pytest.raises(ValueError, match="empty"):
        metric([], [])


def test_logits_instead_of_classes_are_refused():
    with pytest.raises(ValueError, match=r"predictions has shape \(2, 3\)"):
        cm.accuracy(np.zeros((2, 3)), [0, 1])


# --------------------------------------------------------------------------
# Token tagging.

def test_tagging_accuracy_ignores_masked_labels():
    predictions = [[1, 2, 3], [4, 5, 6]]
    labels = [[1, 0, -100], [4, -100, 6]]
    # Four labelled positions, three right (the 2 vs 0 is wrong).
    assert cm.tagging_accuracy(predictions, labels) == pytest.approx(0.75)
    assert cm.tagging_accuracy([[1, 9]], [[1, 0]], ignore=0) == 1.0
    with pytest.raises(ValueError, match="ignore=-100"):
        cm.tagging_accuracy([1, 2], [-100, -100])


@pytest.mark.parametrize("predicted, f1", [
    (["B-PER", "I-PER", "O", "B-LOC"], 1.0),
    (["I-PER", "I-PER", "O", "I-LOC"], 1.0),    # I- without B- starts an entity
    (["B-PER", "I-LOC", "O", "B-LOC"], 0.4),    # a type change ends one: PER 0, LOC 1
    (["B-PER", "B-PER", "O", "B-LOC"], 0.4),    # B- ends one: PER 0, PER 1
])
def test_entities_are_read_as_conlleval_does(predicted, f1):
    # Gold: PER 0-1, LOC 3. The first two rows find both: F1 = 1. The last
    # two predict PER 0, (LOC or PER) 1 and LOC 3, one of them right:
    # P = 1/3, R = 1/2, F1 = 2 * (1/6) / (5/6) = 0.4.
    assert cm.entity_f1([predicted], [["B-PER", "I-PER", "O", "B-LOC"]])["f1"] == \
        pytest.approx(f1)


def test_entity_f1_by_hand():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["I-ORG", "I-ORG", "O"]]
    predicted = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "I-ORG", "O"]]
    # Gold: PER 0-1, LOC 3, ORG 0-1 (I- without B-). Predicted: PER 0-1, ORG 3
    # (wrong type), ORG 0-1. Two of three right on each side.
    scores = cm.entity_f1(predicted, gold)
    assert scores == pytest.approx({"precision": 2 / 3, "recall": 2 / 3, "f1": 2 / 3})
    # One of two gold entities found, nothing spurious: P=1, R=1/2, F1=2/3.
    scores = cm.entity_f1([["B-PER", "O", "O", "O"]], [["B-PER", "O", "B-LOC", "O"]])
    assert scores == pytest.approx({"precision": 1.0, "recall": 0.5, "f1": 2 / 3})
    # A span that is one token short is wrong: exact boundaries are required.
    assert cm.entity_f1([["B-PER", "O"]], [["B-PER", "I-PER"]])["f1"] == 0.0
    # Nothing predicted: all zero, no division error.
    assert cm.entity_f1([["O"]], [["B-PER"]]) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}


def test_entity_f1_bad_inputs():
    with pytest.raises(ValueError, match="sentence 1"):
        cm.entity_f1([["O"], ["O"]], [["O"], ["O", "O"]])
    with pytest.raises(ValueError, match="predicted_tags has 1 sentences"):
        cm.entity_f1([["O"]], [["O"], ["O"]])
    with pytest.raises(ValueError, match=r"gold_tags\[0\], token 1: tag 'E-PER'"):
        cm.entity_f1([["O", "O"]], [["B-PER", "E-PER"]])


# --------------------------------------------------------------------------
# SQuAD: the official metric.

@pytest.mark.parametrize("text, normalized", [
    ("The Denver Broncos!", "denver broncos"),
    ("  an  Apple,\ta day ", "apple day"),
    ("theater", "theater"),            # articles only as whole words
    ("Broncos' win", "broncos win"),
    ("A-team", "ateam"),               # punctuation goes first, so no article is left
    ("24–10", "24–10"),                # the en dash is not in string.punctuation
])
def test_normalize_answer(text, normalized):
    assert squad.normalize_answer(text) == normalized


def test_exact_match_and_f1_scores():
    assert squad.exact_match_score("the Cat", "cat.")
    assert not squad.exact_match_score("cats", "cat")
    # Tokens (cat, sat, on, mat) vs (cat, sat): P=2/4, R=1, F1=2/3.
    assert squad.f1_score("the cat sat on the mat", "a cat sat") == pytest.approx(2 / 3)
    # Counts matter: (cat, cat) vs (cat) share one token: P=1/2, R=1.
    assert squad.f1_score("cat cat", "cat") == pytest.approx(2 / 3)
    assert squad.f1_score("the", "cat") == 0.0
    assert squad.metric_max_over_ground_truths(
        squad.f1_score, "cat sat", ["dog", "cat", "the cat sat"]) == 1.0


def _tiny_dataset():
    qas = [{"id": "q1", "answers": [{"text": "Denver Broncos"}, {"text": "Broncos"}]},
           {"id": "q2", "answers": [{"text": "Santa Clara"}]}]
    return [{"title": "t", "paragraphs": [{"context": "c", "qas": qas}]}]


def test_evaluate_counts_missing_predictions(caplog):
    with caplog.at_level(logging.WARNING, logger=squad.__name__):
        result = squad.evaluate(_tiny_dataset(), {"q1": "the Broncos", "extra": "x"})
    # q1 exact; q2 missing scores 0: 50% each.
    assert result == pytest.approx({"exact_match": 50.0, "f1": 50.0})
    assert "1 of 2 questions have no prediction" in caplog.text and "q2" in caplog.text
    # Partial overlap: "Santa" vs "Santa Clara": P=1, R=1/2, F1=2/3.
    result = squad.evaluate(_tiny_dataset(), {"q1": "Denver", "q2": "Santa"})
    assert result == pytest.approx({"exact_match": 0.0, "f1": 100 * (2 / 3 + 2 / 3) / 2})


def test_files_and_command_line(tmp_path, capsys):
    dataset_file, predictions_file = tmp_path / "dev.json", tmp_path / "pred.json"
    dataset_file.write_text(json.dumps({"version": "1.1", "data": _tiny_dataset()}))
    predictions_file.write_text(json.dumps({"q1": "Broncos", "q2": "Santa Clara"}))
    squad.main([str(dataset_file), str(predictions_file)])
    assert json.loads(capsys.readouterr().out) == {"exact_match": 100.0, "f1": 100.0}

    wrong_version = tmp_path / "v2.json"
    wrong_version.write_text(json.dumps({"version": "v2.0", "data": []}))
    with pytest.raises(ValueError, match=r"v2\.json.*'v2.0'"):
        squad.load_dataset(str(wrong_version))
    with pytest.raises(ValueError, match=r"pred\.json.*'data'"):
        squad.load_dataset(str(predictions_file))
    a_list = tmp_path / "list.json"
    a_list.write_text(json.dumps(["Broncos"]))
    with pytest.raises(ValueError, match=r"list\.json"):
        squad.load_predictions(str(a_list))
    with pytest.raises(ValueError, match="no questions"):
        squad.evaluate([], {})


@pytest.mark.slow
def test_leaderboard_predictions_score_the_published_figures(shared_data, caplog):
    """The BERT ensemble's leaderboard predictions: EM 86.2 / F1 92.2 (README)."""
    folder = shared_data / "squad_v1.1"
    dataset = squad.load_dataset(str(folder / "dev-v1.1.reconstructed.json"))
    predictions = squad.load_predictions(str(folder / "leaderboard_pred_BERT_ensemble_dev.json"))
    assert sum(len(p["qas"]) for a in dataset for p in a["paragraphs"]) == 10570
    with caplog.at_level(logging.WARNING, logger=squad.__name__):
        result = squad.evaluate(dataset, predictions)
    assert not caplog.records, "every dev question has a leaderboard prediction"
    assert (round(result["exact_match"], 1), round(result["f1"], 1)) == (86.2, 92.2), result


# --------------------------------------------------------------------------
# SQuAD: span search.

def _all_spans(start_logits, end_logits, valid, max_answer_length, starts=None, ends=None):
    """Brute force: every allowed span (restricted to `starts` x `ends` if given)."""
    positions = np.flatnonzero(valid)
    spans = [squad.Span(int(s), int(e), float(start_logits[s] + end_logits[e]))
             for s, e in itertools.product(positions, positions)
             if s <= e and e - s + 1 <= max_answer_length
             and (starts is None or s in starts) and (ends is None or e in ends)]
    return sorted(spans, key=lambda span: -span.score)


def _window(rng, length=40, question=8, padding=6):
    """[CLS] question [SEP] context [SEP] padding: valid on the context only."""
    valid = np.zeros(length, bool)
    valid[question + 2:length - padding - 1] = True
    return rng.normal(size=length) * 3, rng.normal(size=length) * 3, valid


@pytest.mark.parametrize("seed", range(5))
def test_best_spans_against_brute_force(seed):
    rng = np.random.default_rng(seed)
    start_logits, end_logits, valid = _window(rng)
    n_best, max_answer_length = 5, 4
    spans = squad.best_spans(start_logits, end_logits, n_best=n_best,
                             max_answer_length=max_answer_length, valid=valid)
    # With candidates limited to the 5 best valid starts and ends, as run_squad.py.
    top_starts = set(np.flatnonzero(valid)[np.argsort(-start_logits[valid])[:n_best]])
    top_ends = set(np.flatnonzero(valid)[np.argsort(-end_logits[valid])[:n_best]])
    expected = _all_spans(start_logits, end_logits, valid, max_answer_length,
                          top_starts, top_ends)[:n_best]
    assert spans == expected  # same float sums on both sides, so exact
    # Every answer is an allowed span with its true score, best first.
    every_span = _all_spans(start_logits, end_logits, valid, max_answer_length)
    assert set(spans) <= set(every_span)
    assert [s.score for s in spans] == sorted((s.score for s in spans), reverse=True)
    # When the candidate lists cover every valid token the search is exhaustive.
    spans = squad.best_spans(start_logits, end_logits, n_best=int(valid.sum()),
                             max_answer_length=max_answer_length, valid=valid)
    assert spans == every_span[:int(valid.sum())]


def test_best_spans_by_hand():
    start_logits = np.array([9.0, 0.0, 5.0, 1.0, 0.0])
    end_logits = np.array([9.0, 0.0, 1.0, 4.0, 3.0])
    valid = np.array([False, True, True, True, True])  # token 0 is [CLS]
    spans = squad.best_spans(start_logits, end_logits, n_best=2, max_answer_length=2,
                             valid=valid)
    # Starts {2, 3} x ends {3, 4}: (2, 3)=9, (3, 4)=4, (3, 3)=5; (2, 4) is too long.
    assert spans == [(2, 3, 9.0), (3, 3, 5.0)]
    # Best start after the best end and n_best=1: no candidate at all.
    assert squad.best_spans([0, 0, 5.0], [0, 5.0, 0], n_best=1, max_answer_length=3,
                            valid=[True] * 3) == []


def test_best_spans_bad_inputs():
    with pytest.raises(ValueError, match=r"start_logits \(3,\), end_logits \(4,\)"):
        squad.best_spans(np.zeros(3), np.zeros(4), n_best=1, max_answer_length=1,
                         valid=np.ones(3, bool))
    with pytest.raises(ValueError, match=r"start_logits \(2, 3\)"):
        squad.best_spans(np.zeros((2, 3)), np.zeros((2, 3)), n_best=1, max_answer_length=1,
                         valid=np.ones((2, 3), bool))
    with pytest.raises(ValueError, match="n_best=0"):
        squad.best_spans(np.zeros(3), np.zeros(3), n_best=0, max_answer_length=1,
                         valid=np.ones(3, bool))

