"""A linear softmax probe on frozen word features, and its tagging scores
(accuracy over words; entity F1 when the tags are BIO).

`fit_probe` takes the training and evaluation features, the stacked hidden
states of every word as float32 `[layers + 1, words, hidden]` (or a list of
per-sentence `[layers + 1, n_i, hidden]` arrays, as
`FeatureExtractor.hidden_states` returns them), and one int class id per word
(`tag_ids` makes them from tags). It combines the states by a layer strategy
(`strategies.combine_layers`), trains a linear classifier with Adam and
returns a `ProbeResult`: the evaluation and training accuracies, the
predicted class of every evaluation word (`[words]`), the trained parameters
and the seconds taken. `tag_scores` scores those predictions against the gold
tags. `launch/extract_features.py` runs it for every layer strategy.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax.analysis.features.strategies import check_strategy, combine_layers
from bert_jax.evaluation.classification_metrics import entity_f1, is_bio, tagging_accuracy


@dataclasses.dataclass
class ProbeResult:
    """accuracy on the eval words, on the train words, the predicted class of
    every eval word (`[words]`), the trained parameters (`kernel`, `bias`, and
    for weighted_sum `logits`, `gamma`; they apply to standardized features
    when `standardize` was on) and the seconds taken."""

    accuracy: float
    train_accuracy: float
    eval_predictions: np.ndarray
    params: dict[str, np.ndarray]
    feature_dim: int
    seconds: float

    def layer_weights(self) -> np.ndarray | None:
        """softmax(logits) of a weighted_sum probe, else None."""
        if "logits" not in self.params:
            return None
        logits = np.asarray(self.params["logits"], np.float64)
        e = np.exp(logits - logits.max())
        return e / e.sum()


def stack_words(features: Sequence[np.ndarray] | np.ndarray) -> np.ndarray:
    """Per-sentence `[layers + 1, n_i, hidden]` -> `[layers + 1, sum n_i, hidden]`
    (an array passes through)."""
    if isinstance(features, (np.ndarray, jax.Array)):
        return np.asarray(features, np.float32)
    return np.concatenate([np.asarray(f, np.float32) for f in features], axis=1)


def _labels(labels) -> np.ndarray:
    if isinstance(labels, (np.ndarray, jax.Array)):
        return np.asarray(labels, np.int32).reshape(-1)
    labels = list(labels)
    if labels and np.ndim(labels[0]) > 0:
        return np.concatenate([np.asarray(l, np.int32).reshape(-1) for l in labels])
    return np.asarray(labels, np.int32)


def _inputs(states: np.ndarray, strategy: str, stats=None):
    """The probe's input and the standardization statistics (of the training
    set, computed when `stats` is None): `[words, features]`, or for
    weighted_sum every state standardized, `[layers + 1, words, hidden]`."""
    x = states if strategy == "weighted_sum" else np.asarray(combine_layers(states, strategy))
    if stats is None:
        axis = 1 if strategy == "weighted_sum" else 0
        mean = x.mean(axis=axis, keepdims=True, dtype=np.float64).astype(np.float32)
        std = x.std(axis=axis, keepdims=True, dtype=np.float64).astype(np.float32)
        stats = (mean, np.maximum(std, 1e-6))
    mean, std = stats
    return ((x - mean) / std).astype(np.float32), stats


def _logits(params, x, strategy):
    if strategy == "weighted_sum":
        x = combine_layers(x, "weighted_sum", {"logits": params["logits"],
                                               "gamma": params["gamma"]})
    return x @ params["kernel"] + params["bias"]


def fit_probe(train_features, train_labels, eval_features, eval_labels, *,
              num_classes: int, strategy: str, steps: int = 300, lr: float = 1e-2,
              seed: int = 0, batch_size: int | None = None, weight_decay: float = 0.0,
              standardize: bool = False, ignore: int = -100) -> ProbeResult:
    """Trains a linear softmax classifier on frozen features.

    Args:
      train_features, eval_features: the stacked hidden states of every word,
        `[layers + 1, words, hidden]`, or a list of per-sentence
        `[layers + 1, n_i, hidden]` arrays (as `FeatureExtractor.hidden_states`
        returns).
      train_labels, eval_labels: a class id per word: `[words]` or a list of
        per-sentence id lists; `ignore` marks a word to leave out.
      strategy: the layer strategy the probe sees (`combine_layers`); for
        `weighted_sum` the scalar-mix logits and gamma are trained with it.
      steps, lr: Adam steps (full-batch unless `batch_size`) and learning rate.
      seed: initialization (small normal kernel) and mini-batch sampling; the
        same seed gives the same result.
      batch_size: words per step, drawn with replacement; None: all of them.
      weight_decay: L2 penalty on the kernel.
      standardize: scale the features to zero mean, unit variance with the
        training statistics (per state for weighted_sum, as ELMo's optional
        layer norm). It does not change what a linear probe can express; off
        by default: BERT's states are LayerNorm outputs of similar scale, and on
        MiniLM + UD-EWT (200 training sentences) it overfits slightly more.
    """
    start = time.perf_counter()
    check_strategy(strategy)
    if steps < 1:
        raise ValueError(f"steps={steps}: need at least 1.")
    x_train, y_train = stack_words(train_features), _labels(train_labels)
    x_eval, y_eval = stack_words(eval_features), _labels(eval_labels)
    for name, x, y in (("train", x_train, y_train), ("eval", x_eval, y_eval)):
        if x.ndim != 3 or x.shape[1] != y.shape[0]:
            raise ValueError(f"{name} features have shape {x.shape} (want [layers + 1, "
                             f"words, hidden]) for {y.shape[0]} labels.")
        if (y >= num_classes).any() or ((y < 0) & (y != ignore)).any():
            raise ValueError(f"{name} labels must be in [0, {num_classes}) or {ignore}.")
    check_strategy(strategy, x_train.shape[0])
    if standardize:
        x_train, stats = _inputs(x_train, strategy)
        x_eval, _ = _inputs(x_eval, strategy, stats)
    else:
        if strategy != "weighted_sum":
            x_train = np.asarray(combine_layers(x_train, strategy))
            x_eval = np.asarray(combine_layers(x_eval, strategy))
    dim = x_train.shape[-1]
    num_words = y_train.shape[0]

    key = jax.random.PRNGKey(seed)
    init_key, batch_key = jax.random.split(key)
    params = {"kernel": 0.01 * jax.random.normal(init_key, (dim, num_classes)),
              "bias": jnp.zeros((num_classes,))}
    if strategy == "weighted_sum":
        params["logits"] = jnp.zeros((x_train.shape[0],))
        params["gamma"] = jnp.ones(())
    optimizer = optax.adam(lr)

    def loss_fn(params, x, y):
        logits = _logits(params, x, strategy)
        valid = y != ignore
        losses = optax.softmax_cross_entropy_with_integer_labels(
            logits, jnp.where(valid, y, 0))
        loss = jnp.sum(losses * valid) / jnp.maximum(valid.sum(), 1)
        return loss + weight_decay * jnp.sum(params["kernel"] ** 2)

    def step(carry, i, x_all, y_all):
        params, opt_state = carry
        if batch_size and batch_size < num_words:
            index = jax.random.randint(jax.random.fold_in(batch_key, i), (batch_size,),
                                       0, num_words)
            x = jnp.take(x_all, index, axis=x_all.ndim - 2)
            y = y_all[index]
        else:
            x, y = x_all, y_all
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    @jax.jit
    def train(params, x_all, y_all):
        carry = (params, optimizer.init(params))
        (params, _), losses = jax.lax.scan(
            lambda c, i: step(c, i, x_all, y_all), carry, jnp.arange(steps))
        return params, losses

    params, _ = train(params, jnp.asarray(x_train), jnp.asarray(y_train))

    predict = jax.jit(lambda p, x: jnp.argmax(_logits(p, x, strategy), axis=-1))

    def predictions(x):
        """`[words]` classes of `[..., words, features]` inputs, in chunks."""
        chunk, words = 16384, x.shape[-2]
        return np.concatenate([np.asarray(predict(params, jnp.asarray(
            np.take(x, np.arange(i, min(i + chunk, words)), axis=x.ndim - 2))))
            for i in range(0, words, chunk)])

    eval_predictions = predictions(x_eval)
    return ProbeResult(
        accuracy=tagging_accuracy(eval_predictions, y_eval, ignore=ignore),
        train_accuracy=tagging_accuracy(predictions(x_train), y_train, ignore=ignore),
        eval_predictions=eval_predictions,
        params={k: np.asarray(v) for k, v in params.items()}, feature_dim=dim,
        seconds=time.perf_counter() - start)


def probe(*args, **kwargs) -> float:
    """The eval accuracy (`tagging_accuracy`) of `fit_probe(*args, **kwargs)`."""
    return fit_probe(*args, **kwargs).accuracy


def tag_ids(sentences_tags: Sequence[Sequence[str]], tags: Sequence[str],
            ignore: int = -100) -> list[list[int]]:
    """Each word's index in `tags` (`ignore` for a tag outside it, e.g. an
    evaluation tag the training data never had)."""
    index = {tag: i for i, tag in enumerate(tags)}
    return [[index.get(tag, ignore) for tag in sentence] for sentence in sentences_tags]


def tag_scores(predictions: np.ndarray, gold_tags: Sequence[Sequence[str]],
               tags: Sequence[str]) -> dict[str, float]:
    """Scores of a probe's `[words]` predicted class ids (`ProbeResult.
    eval_predictions`, sentences one after another) against the gold tags of
    those sentences: `accuracy` over every word, and when `tags` are BIO,
    entity-level `entity_f1` (seqeval, as CoNLL-2003 NER is scored)."""
    lengths = [len(sentence) for sentence in gold_tags]
    if len(predictions) != sum(lengths):
        raise ValueError(f"{len(predictions)} predictions for {sum(lengths)} gold words; "
                         "pass the eval sentences the probe was scored on.")
    predicted = [[tags[int(i)] for i in sentence]
                 for sentence in np.split(np.asarray(predictions), np.cumsum(lengths)[:-1])]
    scores = {"accuracy": float(np.mean([p == g for ps, gs in zip(predicted, gold_tags)
                                         for p, g in zip(ps, gs)]))}
    if is_bio(tags):
        scores["entity_f1"] = entity_f1(predicted, gold_tags)["f1"]
    return scores
