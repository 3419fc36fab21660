"""The Task interface: what an experiment family gives the one train loop.

A task binds a model to its inputs, its loss and its evaluation. The loop
(`bert_jax.training.trainer`) never looks inside batches: it asks the task for
per-process iterators of numpy batches, a loss returning sums, and evaluation
sums, and divides sums by weights itself so padding never counts.
"""

from __future__ import annotations

import abc
from typing import Any, Callable, Iterable, Iterator, TypeVar

import flax.linen as nn
import jax
import ml_collections
from jax.experimental import multihost_utils

from bert_jax.modeling.configs import ConfigError, StackConfig
from bert_jax.training.auto_dtype import resolve_model_dtype

Batch = dict[str, Any]
Sums = dict[str, jax.Array]

T = TypeVar("T")

_REGISTRY: dict[str, Callable[[ml_collections.ConfigDict, str], "Task"]] = {}


def register(name: str):
    """Class decorator: makes a Task constructible as `config.task = name`."""
    def wrap(cls):
        _REGISTRY[name] = cls
        return cls
    return wrap


def build_task(config: ml_collections.ConfigDict, workdir: str | None,
               abstract: bool = False) -> "Task":
    """The task named by `config.task`; `workdir` holds its state (vocabularies).

    `abstract=True` builds the model and the batch shapes only, reading no data
    and writing nothing (`workdir` may be None): what ahead-of-time compilation
    (`bert_jax.training.aot`) needs. Vocabulary sizes then come from the config.
    """
    config = resolve_model_dtype(config)  # 'auto' -> the local devices' dtype
    if config.task not in _REGISTRY:
        raise ConfigError(f"config.task={config.task!r}: unknown task; registered tasks "
                         f"are {sorted(_REGISTRY)}.")
    cls = _REGISTRY[config.task]
    if not abstract:
        return cls(config, workdir)
    if not cls.supports_abstract:
        supported = sorted(name for name, c in _REGISTRY.items() if c.supports_abstract)
        raise ConfigError(f"config.task={config.task!r} cannot be built without its data "
                         f"(ahead-of-time compilation); tasks that can: {supported}.")
    return cls(config, workdir, abstract=True)


def written_by_process_zero(load_or_create: Callable[[bool], T], what: str) -> T:
    """`load_or_create(is_writer)` on process 0 first (it may write files, e.g.
    a vocabulary), then on the others after a barrier (they only read)."""
    writer = jax.process_index() == 0
    value = load_or_create(True) if writer else None
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(f"bert_jax: {what} written")
    return value if writer else load_or_create(False)


class Task(abc.ABC):
    """One experiment family. Subclasses set `model_config` and `model`."""

    model_config: StackConfig
    model: nn.Module
    supports_abstract: bool = False  # can be built without data (`build_task`)

    def __init__(self, config: ml_collections.ConfigDict, workdir: str | None,
                 abstract: bool = False):
        self.config = config
        self.workdir = workdir
        self.abstract = abstract

    @abc.abstractmethod
    def dummy_batch(self) -> Batch:
        """A batch of the right shapes (one row is enough) for `init`."""

    def init_variables(self, rng: jax.Array) -> Any:
        """The model's (boxed) variables; the loop derives shardings from them."""
        batch = self.dummy_batch()
        return self.model.init(rng, *self.model_inputs(batch))

    @abc.abstractmethod
    def model_inputs(self, batch: Batch) -> tuple:
        """Positional model arguments taken from a batch."""

    def batch_spec(self, train: bool = True) -> dict[str, jax.ShapeDtypeStruct]:
        """Shapes and dtypes of one global training (or evaluation) batch,
        known without reading data: what ahead-of-time compilation lowers the
        train and evaluation steps with."""
        raise NotImplementedError(f"{type(self).__name__} gives no batch_spec.")

    @abc.abstractmethod
    def train_iterator(self, process_index: int, process_count: int) -> Iterator[Batch]:
        """Infinite, deterministic, checkpointable iterator of this process's rows."""

    @abc.abstractmethod
    def eval_batches(self, process_index: int, process_count: int) -> Iterable[Batch]:
        """One pass over the evaluation split; the same count on every process."""

    @abc.abstractmethod
    def loss_fn(self, params: Any, batch: Batch, rng: jax.Array
                ) -> tuple[jax.Array, jax.Array, Sums]:
        """Training loss: (loss summed over real targets, their count, other sums)."""

    @abc.abstractmethod
    def eval_sums(self, params: Any, batch: Batch, masks: dict[str, Any] | None = None
                  ) -> Sums:
        """Evaluation sums with a `weight` entry; metrics are `sum / weight`.
        `masks`: head/layer masks for ablation (`head_mask_shapes`), None for
        the plain model."""

    def generation_metrics(self, params: Any, mesh, step: int,
                           masks: dict[str, Any] | None = None) -> dict[str, float]:
        """Metrics of generated outputs or of the predictions of the whole
        split (e.g. BLEU of decoded translations, F1), computed at evaluation
        steps next to the `eval_sums` metrics; by default none. `masks`: as
        for `eval_sums`."""
        del params, mesh, step, masks
        return {}

    def head_mask_shapes(self) -> dict[str, tuple[int, int]]:
        """Head-ablation groups -> `(layers, heads)`: the `masks` that
        `eval_sums(params, batch, masks)` and `generation_metrics` accept
        (1 keeps a head, 0 removes it; e.g. BERT `{'head_mask': (L, H)}`, plus
        an optional `layer_mask` `[L]` bool)."""
        raise NotImplementedError(f"{type(self).__name__} does not support head ablation.")

    def derived_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """Metrics computed from the evaluation means (e.g. perplexity from
        the mean NLL); by default none."""
        del metrics
        return {}

    @abc.abstractmethod
    def flops_per_step(self) -> float:
        """Model FLOPs of one training step (see bert_jax.training.flops)."""

    @abc.abstractmethod
    def tokens_per_step(self) -> float:
        """Tokens (padded positions included) in one global training batch."""
