"""The Task interface: what an experiment family gives the one train loop, and
the registry that builds a task from `config.task` (`build_task`).

The loop (`bert_jax.training.trainer`) never looks inside batches. It asks the
task for per-process iterators of batches (`train_iterator`, `eval_batches`:
dicts of numpy arrays with a leading row axis, `[local_batch, ...]`), for the
model's initial variables (`init_variables`, a pytree), for a loss returning
sums (`loss_fn(params, batch, rng) -> (loss_sum, weight_sum, other sums)`),
and for evaluation outputs (`predict`: the sums, and per-row predictions that
`decode_predictions` maps back to examples for the evaluators). The loop
divides sums by weights itself, so padding never counts. A subclass gives
`model_config` and `make_model` and registers itself with `@register("name")`;
`translation`, `bert_pretraining` and `finetune` are the project's.
"""

from __future__ import annotations

import abc
import functools
import os
import types
from collections.abc import Mapping
from typing import Any, Callable, Iterable, Iterator, TypeVar

import flax.linen as nn
import jax
import ml_collections
from jax.experimental import multihost_utils

from bert_jax.config_schema import choice, refuse
from bert_jax.errors import DamagedFileError
from bert_jax.modeling.configs import StackConfig
from bert_jax.auto_dtype import resolve_model_dtype
from bert_jax.workdir_layout import CHECKPOINT_DIR, checkpoint_steps, saved_model_dtype

Batch = dict[str, Any]
Sums = dict[str, jax.Array]

T = TypeVar("T")

_REGISTRY: dict[str, Callable[[ml_collections.ConfigDict, str], "Task"]] = {}


def register(name: str):
    def wrap(cls):
        _REGISTRY[name] = cls
        return cls
    return wrap


def task_class(name: str) -> type["Task"] | None:
    return _REGISTRY.get(name)


def build_task(config: ml_collections.ConfigDict, workdir: str | None,
               abstract: bool = False) -> "Task":
    """The task named by `config.task`; `workdir` holds its state (vocabularies).
    Building reads only the model dtype of a run already in `workdir` (which
    `model.dtype='auto'` keeps; else the local devices' dtype) and writes nothing:
    the task reads its data, trains its vocabulary and makes its model on first use
    (`model_config`, `model`, the iterators), so the trainer checks the very task
    it then trains (`training.validation`). `abstract=True`: the model and batch
    shapes only, never reading data (ahead-of-time compilation); vocabulary sizes
    from the config."""
    cls = _REGISTRY[choice("config.task", config.task, sorted(_REGISTRY))]
    config = resolve_model_dtype(config, saved_dtype=saved_model_dtype(workdir))
    if abstract and not cls.supports_abstract:
        supported = sorted(name for name, c in _REGISTRY.items() if c.supports_abstract)
        refuse([f"config.task={config.task!r} needs its data; tasks that can: {supported}."],
               "the config cannot be compiled ahead of time")
    return cls(config, workdir, abstract=True) if abstract else cls(config, workdir)


# The sections of every config a training run saves (config.json).
SAVED_SECTIONS = ("model", "data", "train")


def check_saved_config(saved: Mapping[str, Any], path: str) -> None:
    """Raises a `DamagedFileError` naming `path` (a workdir's config.json, read into
    `saved`) when it is no JSON object, names no task or lacks a section of
    `SAVED_SECTIONS`, or naming the key when its "model" section holds one its task's
    model config lacks (an edited file): each would fail deep inside the task instead."""
    if not isinstance(saved, Mapping):
        problem = f"holds a JSON {type(saved).__name__}, not the object of a config"
    elif not isinstance(saved.get("task"), str):
        problem = 'names no task (no "task" key)'
    else:
        problem = next((f"lacks the {section!r} section" for section in SAVED_SECTIONS
                        if not isinstance(saved.get(section), Mapping)), None)
    if problem:
        raise DamagedFileError(f"{path} {problem}: it is not the config a training run "
                               "writes. Restore it from a copy, or use a new workdir.")
    name, model = saved.get("task"), saved.get("model")
    cls = task_class(name) if isinstance(name, str) else None
    if cls is not None and cls.model_config_class is not None and isinstance(model, Mapping):
        cls.model_config_class.check_saved(model, path)


def fill_saved_defaults(saved: dict[str, Any]) -> dict[str, Any]:
    """`saved` (a workdir's config.json, checked) with the keys its task gained
    since it was written (`Task.saved_defaults`) added where it lacks them, in place."""
    cls = task_class(saved["task"]) if isinstance(saved.get("task"), str) else None
    for key, value in (cls.saved_defaults.items() if cls else ()):
        *sections, name = key.split(".")
        node = saved
        for section in sections:   # a section that is no object: left to the task
            node = node.setdefault(section, {}) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.setdefault(name, value)
    return saved


def cached_method(method: Callable) -> Callable:
    """Caches `method(self, arg)` per instance and argument; unlike
    `functools.cache`, the cache dies with its task."""
    @functools.wraps(method)
    def cached(self, arg):
        cache = self.__dict__.setdefault("_method_cache", {})
        key = (method.__name__, arg)
        if key not in cache:
            cache[key] = method(self, arg)
        return cache[key]
    return cached


def holds_checkpoints(workdir: str) -> bool:
    """Whether `workdir` holds checkpoints: what they were trained with (a vocabulary) is
    then only read, never made again (it could differ: other ids)."""
    return bool(checkpoint_steps(os.path.join(workdir, CHECKPOINT_DIR)))


def written_by_process_zero(load_or_create: Callable[[bool], T], what: str) -> T:
    """`load_or_create(is_writer)` on process 0 first (it may write files, e.g.
    a vocabulary), then on the others after a barrier (they only read)."""
    writer = jax.process_index() == 0
    value = load_or_create(True) if writer else None
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(f"bert_jax: {what} written")
    return value if writer else load_or_create(False)


class Task(abc.ABC):
    """One experiment family. Subclasses give `model_config` (a property: made on
    first use, like the data) and `make_model`."""

    model_config: StackConfig
    # The class `config.model` builds: its fields are the keys a workdir's
    # config.json may hold under "model" (`check_saved_config`); None: unchecked.
    model_config_class: type[StackConfig] | None = None
    supports_abstract: bool = False  # can be built without data (`build_task`)
    # Config keys (or `section.` prefixes) of this task an evaluation of its
    # workdir may change, beyond `training.evaluation.EVALUATION_OVERRIDES`.
    evaluation_overrides: tuple[str, ...] = ()
    # Config keys this task gained after workdirs were written, with the value
    # that reproduces how those ran (`fill_saved_defaults`): an older workdir's
    # config.json then takes their overrides in evaluation and resumes training.
    saved_defaults: Mapping[str, Any] = types.MappingProxyType({})
    # Batch features the model takes by keyword when a batch has them.
    model_keywords: tuple[str, ...] = ()

    def __init__(self, config: ml_collections.ConfigDict, workdir: str | None,
                 abstract: bool = False):
        self.config = config
        self.workdir = workdir
        self.abstract = abstract

    def declared_model_config(self) -> StackConfig | None:
        """The model config as `config` declares it (vocabulary size from the
        config), made without data and checked against the input length: what
        `training.validation` checks. None: the task learns it from its data."""
        return None

    @functools.cached_property
    def model(self) -> nn.Module:
        return self.make_model()

    @abc.abstractmethod
    def make_model(self) -> nn.Module:
        """The model of `model_config` (made once, on first use of `model`)."""

    @functools.cached_property
    def batch_rows(self) -> int:
        """Rows of a global training batch."""
        return self.config.train.batch_size

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

    def _outputs(self, params: Any, batch: Batch, rng: jax.Array | None = None,
                 model_kwargs: dict[str, Any] | None = None) -> Any:
        """The model on `batch`: with dropout from `rng`, deterministic without."""
        deterministic = rng is None
        keywords = {key: batch[key] for key in self.model_keywords if key in batch}
        return self.model.apply({"params": params}, *self.model_inputs(batch), **keywords,
                                **(model_kwargs or {}), deterministic=deterministic,
                                rngs=None if deterministic else {"dropout": rng})

    def batch_spec(self, train: bool = True) -> dict[str, jax.ShapeDtypeStruct]:
        """Shapes and dtypes of one global training (or evaluation) batch, known
        without data (for ahead-of-time compilation)."""
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
    def predict(self, params: Any, batch: Batch, model_kwargs: dict[str, Any] | None = None
                ) -> dict[str, Any]:
        """Evaluation outputs of one global batch: `sums` (with `weight`: metrics
        are `sum / weight`), and for tasks scored on the whole split's
        predictions per-row arrays `[batch, ...]` with `row` (index in the split)
        and `real` (False for padding), for `decode_predictions`. `model_kwargs`:
        extra model arguments (e.g. `head_mask` `[layers, heads]`)."""

    def default_evals(self) -> dict[str, dict[str, Any]]:
        """Evaluator name -> options, run when `config.evals` is empty."""
        return {"loss": {}}

    def decode_predictions(self, split: str, rows: dict[int, dict[str, Any]]
                           ) -> dict[str, Any]:
        """The split's predictions for the evaluators (e.g. `index`, `predicted`,
        `labels`), from `predict`'s per-row outputs (row index -> its arrays)."""
        raise NotImplementedError(f"{type(self).__name__} predicts no rows.")

    def generator(self, params: Any, mesh) -> Callable[[int], tuple[list, list, list]] | None:
        """`generate(count) -> (sources, references, hypotheses)` as text, on the
        evaluation split's first examples; None: the task does not generate."""
        del params, mesh
        return None

    @abc.abstractmethod
    def flops_per_step(self) -> float:
        """Model FLOPs of one training step (see bert_jax.modeling.flops)."""

    @abc.abstractmethod
    def tokens_per_step(self) -> float:
        """Tokens (padded positions included) in one global training batch."""
