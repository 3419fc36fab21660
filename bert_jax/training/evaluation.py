"""The evaluation of a model: the evaluators of `config.evals` over one pass of
the evaluation split, during training or from a workdir's checkpoint.

`make_evaluator(task, mesh)` returns `evaluate(params, step)`, which the
trainer calls every `train.eval_every` steps. Each process reads its rows of
every global batch (`Task.eval_batches`); the jitted `Task.predict` returns
the batch's evaluation sums (float32 scalars, with a `weight`) and, for tasks
scored on the whole split's predictions, per-row outputs `[batch, ...]`
gathered on the host (only the rows marked `real`, keyed by `row`). The task
decodes those rows once (`decode_predictions`), and the evaluators
(`bert_jax.evaluation.evaluators`) turn the sums and predictions into the
metrics `{"eval/<name>": float}` and files (e.g. predictions, samples).

From a workdir (`launch/evaluate.py`, `translate.py`, `ablate.py`,
`bert_jax.analysis.encoders`): `evaluation_config` gives the experiment, the
workdir's `config.json`, where only what evaluation may change can be
overridden (`EVALUATION_OVERRIDES`, `Task.evaluation_overrides`);
`restore_for_inference` restores a checkpoint's parameters, which must match
the model exactly, and `evaluate_checkpoint` evaluates them.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import traverse_util

from bert_jax.config_schema import evaluation_problems, refuse
from bert_jax.errors import CheckpointError, UserError
from bert_jax.evaluation import evaluators as evaluators_lib
from bert_jax.file_io import read_json
from bert_jax.tasks import Task, build_task
from bert_jax.tasks.base import check_saved_config, fill_saved_defaults, task_class
from bert_jax.training.checkpoints import restore_params, vanished_step
from bert_jax.training.sharding import global_batch, mesh_from_config, replicated
from bert_jax.training.train_step import abstract_train_state
from bert_jax.training.workdir import CONFIG_FILE, check_step, check_workdir
from bert_jax.workdir_layout import CHECKPOINT_DIR, checkpoint_steps


# Config keys any evaluation may change (a key or a `section.` prefix); a task
# adds its own (`Task.evaluation_overrides`). The rest defines the model, the
# vocabulary, the task or the training run.
EVALUATION_OVERRIDES = (
    "evals", "data.eval_split", "data.data_dir", "train.batch_size", "mesh.",
    "model.attention_impl", "model.remat", "model.dtype",
)
# Config keys of training alone: a value given for evaluation (e.g. by naming
# the experiment file again) is ignored, the workdir's is kept.
TRAINING_ONLY = ("train.", "optimizer.", "seed", "peak_flops")


def jit_predict(task: Task, mesh) -> Callable:
    """`task.predict` jitted, its outputs replicated on every device."""
    return jax.jit(task.predict, out_shardings=replicated(mesh))


def evaluator_specs(task: Task) -> dict[str, tuple[Callable[..., Any], dict[str, Any]]]:
    """name -> (the evaluator, its options), looked up once: `config.evals` (a dict,
    or names taking the task's default options), else the task's `default_evals()`.
    An unknown name fails here, naming the known ones."""
    defaults = task.default_evals()
    evals = task.config.get("evals") or defaults
    if isinstance(evals, (list, tuple)):
        evals = {name: defaults.get(name, {}) for name in evals}
    return {name: (evaluators_lib.get(name), dict(options or {}))
            for name, options in dict(evals).items()}


def _write(directory: str, files: dict[str, Any]) -> None:
    """A full disk or a permission is a `UserError` naming the file."""
    for relative, content in files.items():
        path = os.path.join(directory, relative)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                if path.endswith(".jsonl"):
                    f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in content)
                else:
                    json.dump(content, f, ensure_ascii=False)
        except OSError as e:
            raise UserError(f"cannot write {path} ({e.strerror}).") from e


def make_evaluator(task: Task, mesh, files_dir: str | None = None,
                   report: Callable[[dict[str, float]], None] | None = None
                   ) -> Callable[..., dict[str, float]]:
    """`evaluate(params, step, model_kwargs=None) -> {'eval/<name>': ...}`.

    One pass over the split sums the evaluation sums and gathers every real
    row's outputs, which the task decodes once for all evaluators. Files go to
    `files_dir` (None: none, so evaluating a workdir never writes into it),
    after `report(metrics)` has seen the metrics (a failed write loses nothing).
    With `model_kwargs` (e.g. head masks) generation is skipped (incremental
    decoding takes none) and no file is written.
    """
    predict = jit_predict(task, mesh)
    specs = evaluator_specs(task)
    split = task.config.data.eval_split

    def evaluate(params, step: int, model_kwargs: dict[str, Any] | None = None
                 ) -> dict[str, float]:
        totals, rows = None, {}
        for batch in task.eval_batches(jax.process_index(), jax.process_count()):
            outputs = predict(params, global_batch(batch, mesh), model_kwargs)
            sums = outputs.pop("sums")
            totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
            if outputs:
                outputs = jax.device_get(outputs)
                real = outputs.pop("real")
                for i in np.flatnonzero(real):
                    rows[int(outputs["row"][i])] = jax.tree.map(lambda x: x[i], outputs)
        if totals is None:
            raise ValueError("the evaluation split produced no batches.")
        context = evaluators_lib.Context(
            sums=jax.device_get(totals),
            decoded=task.decode_predictions(split, rows) if rows else None,
            generate=None if model_kwargs else task.generator(params, mesh),
            split=split, step=step)
        metrics, files = {}, {}
        for evaluator, options in specs.values():
            result = evaluator(context, **options)
            metrics.update(result.metrics)
            files.update(result.files)
        metrics = {f"eval/{k}": v for k, v in metrics.items()}
        if report is not None:
            report(metrics)
        if files and model_kwargs is None and jax.process_index() == 0 and files_dir:
            _write(files_dir, files)
        return metrics

    return evaluate


# -- from a workdir ----------------------------------------------------------------


def _matches(key: str, patterns: tuple[str, ...]) -> bool:
    return any(key == p or (p.endswith(".") and key.startswith(p)) or key.startswith(p + ".")
               for p in patterns)


def saved_config(workdir: str) -> ml_collections.ConfigDict:
    """The config a workdir's run was trained with (its `config.json`, JSON
    arrays back as tuples), checked against the task's model config, with the
    keys its task gained since filled in (`Task.saved_defaults`)."""
    check_workdir(workdir)  # before anything reads it
    path = os.path.join(os.path.abspath(workdir), CONFIG_FILE)
    if not os.path.isfile(path):
        raise CheckpointError(f"--workdir={workdir} holds no {CONFIG_FILE}: it is not the "
                              "workdir of a training run (launch/train.py writes it).")
    saved = read_json(path, object_hook=_tuples)
    check_saved_config(saved, path)
    return ml_collections.ConfigDict(fill_saved_defaults(saved))


def _tuples(values: dict) -> dict:
    """JSON arrays back to the tuples configs (and `--config.KEY='(a, b)'`) use."""
    def convert(value):
        return tuple(convert(v) for v in value) if isinstance(value, list) else value
    return {key: convert(value) for key, value in values.items()}


def evaluation_config(workdir: str, requested: ml_collections.ConfigDict | None = None
                      ) -> ml_collections.ConfigDict:
    """The workdir's config with the changes `requested` (the saved config after
    command-line overrides) makes: to `EVALUATION_OVERRIDES` and the task's
    `evaluation_overrides` taken, to `TRAINING_ONLY` ignored, others refused."""
    saved = saved_config(workdir)
    if requested is None:
        return saved
    task = task_class(saved.task)
    overrides = EVALUATION_OVERRIDES + (task.evaluation_overrides if task else ())
    old, new = (traverse_util.flatten_dict(json.loads(c.to_json_best_effort()), sep=".")
                for c in (saved, requested))
    changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    refused = {k: old.get(k) for k in changed if not _matches(k, overrides)
               and not _matches(k, TRAINING_ONLY)}
    config = saved.copy_and_resolve_references()
    config.unlock()
    for key in (k for k in changed if _matches(k, overrides)):
        *sections, name = key.split(".")
        source, target = requested, config
        for section in sections:
            source = source[section]
            if section not in target:
                target[section] = ml_collections.ConfigDict()
            target = target[section]
        target[name] = source[name]
    refuse(evaluation_problems(config, saved, refused, overrides, f"{workdir}/{CONFIG_FILE}"),
           f"cannot evaluate {workdir}")
    return config


def abstract_params(config: ml_collections.ConfigDict, workdir: str):
    """(task, mesh, abstract params): the task built from `config`, its mesh, and
    the shapes, dtypes and shardings of its parameter pytree, for a restore."""
    task = build_task(config, workdir)
    mesh = mesh_from_config(config.mesh)
    state, _ = abstract_train_state(task.init_variables, task.model.apply,
                                    optax.identity(), mesh)
    return task, mesh, state.params


def restore_for_inference(config: ml_collections.ConfigDict, workdir: str,
                          step: int | None = None):
    """(task, mesh, params, step) of a workdir's checkpoint (default: latest),
    which must hold exactly the model's parameters."""
    directory = os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR)
    steps = checkpoint_steps(directory)
    if not steps:
        raise CheckpointError(f"{directory} holds no complete checkpoint.")
    step = steps[-1] if step is None else step
    if step not in steps:
        raise CheckpointError(f"no checkpoint for step {step} in {directory}; "
                              f"available: {steps}.")
    check_step(workdir, step, "step")
    task, mesh, abstract = abstract_params(config, workdir)
    try:
        params, _, _ = restore_params(os.path.join(directory, str(step)), abstract,
                                      strict=True, step_flag="step")
    except CheckpointError as e:
        vanished = vanished_step(directory, step, "step")
        if vanished:
            raise vanished from e
        raise
    return task, mesh, params, step


def evaluate_checkpoint(config: ml_collections.ConfigDict, workdir: str,
                        step: int | None = None, files_dir: str | None = None,
                        report: Callable[[dict[str, float]], None] | None = None
                        ) -> dict[str, float]:
    """{"step": N, "eval/...": ...} of a workdir's checkpoint (default: the latest);
    `report` sees it before the evaluators' files are written to `files_dir`."""
    task, mesh, params, step = restore_for_inference(config, workdir, step)
    with jax.set_mesh(mesh):
        metrics = make_evaluator(task, mesh, files_dir, report and (
            lambda metrics: report({"step": step, **metrics})))(params, step)
    return {"step": step, **metrics}
