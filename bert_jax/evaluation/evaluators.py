"""The evaluators, registered by name as big_vision's are: `config.evals` lists
the ones an evaluation runs, with their options (empty: `Task.default_evals`),
e.g.

    config.evals = {"loss": {}, "classification": {"metrics": ("accuracy", "f1")}}

All of them read the one pass of `bert_jax.training.evaluation` over the
split, given as a `Context`: the evaluation sums of the whole split (float
scalars, with a `weight`) and the task's decoded predictions of the whole
split (a dict of per-example lists, e.g. `index`, `predicted`, `labels`);
generation evaluators (`bleu`) run the task's decoder instead. Each returns a
`Result`: metrics (name -> float; percentages for the task metrics) and files
(relative path -> JSON content) that the evaluation writes. To add one, put
`@register("name")` on `name(context, **options) -> Result`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import numpy as np

from bert_jax.evaluation import classification_metrics, squad
from bert_jax.evaluation.translation_metrics import bleu_and_chrf
from bert_jax.config_schema import choice, refuse
from bert_jax.modeling.losses import sums_to_means


@dataclasses.dataclass
class Context:
    """What an evaluator reads. `decoded`: None when the task predicts no rows;
    `generate` (`Task.generator`): None when masks are applied (incremental
    decoding takes none)."""

    sums: dict[str, float]
    decoded: dict[str, Any] | None
    generate: Callable[[int], tuple[list[str], list[str], list[str]]] | None
    split: str
    step: int


@dataclasses.dataclass
class Result:
    """What an evaluator returns: metrics (name -> float) and the files to
    write (relative path -> JSON content)."""
    metrics: dict[str, float]
    files: dict[str, Any] = dataclasses.field(default_factory=dict)


Evaluator = Callable[..., Result]
_REGISTRY: dict[str, Evaluator] = {}


def register(name: str):
    def wrap(fn: Evaluator) -> Evaluator:
        _REGISTRY[name] = fn
        return fn
    return wrap


def registered() -> list[str]:
    return sorted(_REGISTRY)


def get(name: str) -> Evaluator:
    return _REGISTRY[choice("config.evals", name, registered())]


def _needs(context: Context, name: str, *keys: str) -> dict[str, Any]:
    decoded = context.decoded or {}
    missing = [k for k in keys if k not in decoded]
    if missing:
        refuse([f"config.evals: {name!r} needs predictions {missing}; this task gives "
                f"{sorted(decoded)}."], "the config cannot evaluate")
    return decoded


@register("loss")
def loss(context: Context) -> Result:
    """Means of the sums (`sums_to_means`), and a perplexity for every `*nll`."""
    sums = dict(context.sums)
    weight = sums.pop("weight")
    metrics = {k: float(v) for k, v in jax.device_get(sums_to_means(sums, weight)).items()}
    for key in [k for k in metrics if k.endswith("nll")]:
        metrics[key[:-3] + "perplexity"] = float(np.exp(min(metrics[key], 50.0)))
    return Result(metrics)


def _labelled(context: Context, name: str, metric_names, percent: float) -> Result:
    decoded = _needs(context, name, "index", "predicted", "labels")
    predicted, labels = np.asarray(decoded["predicted"]), np.asarray(decoded["labels"])
    metrics = {m: percent * getattr(classification_metrics, m)(predicted, labels)
               for m in metric_names}
    written = [{"index": i, "prediction": p.item(), "label": g.item()}
               for i, p, g in zip(decoded["index"], predicted, labels)]
    return Result(metrics, {f"predictions/{context.split}_{context.step}.json": written})


@register("classification")
def classification(context: Context, metrics=("accuracy",)) -> Result:
    """Accuracy (or `f1`, `matthews_corrcoef`) of predicted class ids, in percent."""
    return _labelled(context, "classification", metrics, 100.0)


@register("regression")
def regression(context: Context, metrics=("pearson", "spearman")) -> Result:
    """Pearson and Spearman correlations of predicted scores, times 100."""
    return _labelled(context, "regression", metrics, 100.0)


@register("tagging")
def tagging(context: Context) -> Result:
    """Accuracy over words, in percent (a word cut off counts as wrong)."""
    decoded = _needs(context, "tagging", "index", "predicted_tags", "gold_tags")
    pairs = [(p, g) for ps, gs in zip(decoded["predicted_tags"], decoded["gold_tags"])
             for p, g in zip(ps, gs)]
    written = [{"index": i, "predicted": p, "gold": g} for i, p, g in zip(
        decoded["index"], decoded["predicted_tags"], decoded["gold_tags"])]
    return Result({"tag_accuracy": 100.0 * float(np.mean([p == g for p, g in pairs]))},
                  {f"predictions/{context.split}_{context.step}.json": written})


@register("entity_f1")
def entity_f1(context: Context) -> Result:
    """Entity-level F1 of BIO tags (CoNLL-2003's measure), in percent."""
    decoded = _needs(context, "entity_f1", "predicted_tags", "gold_tags")
    scores = classification_metrics.entity_f1(
        [[t or "O" for t in tags] for tags in decoded["predicted_tags"]],
        decoded["gold_tags"])
    return Result({"entity_f1": 100.0 * scores["f1"]})


@register("squad")
def squad_v1(context: Context) -> Result:
    """Exact match and F1 by the official SQuAD v1.1 evaluator, and its input file."""
    decoded = _needs(context, "squad", "answers", "dataset")
    result = squad.evaluate(decoded["dataset"], decoded["answers"])
    return Result({"exact_match": result["exact_match"], "f1": result["f1"]},
                  {f"predictions/{context.split}_{context.step}.json": decoded["answers"]})


@register("bleu")
def bleu(context: Context, examples: int = 0) -> Result:
    """sacreBLEU and chrF on the split's first `examples`, listed in
    `samples/<step>.jsonl`."""
    if not examples or context.generate is None:
        return Result({})
    sources, references, hypotheses = context.generate(examples)
    samples = [{"source": s, "reference": r, "hypothesis": h}
               for s, r, h in zip(sources, references, hypotheses)]
    return Result(bleu_and_chrf(hypotheses, references),
                  {f"samples/{context.step}.jsonl": samples})
