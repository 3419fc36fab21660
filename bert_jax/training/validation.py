"""The checks of a training config that need the task, the files or the devices,
run by the trainer on the task it will train and the mesh it will train on
(`check_training_config(task, mesh)`: the task built, its data not yet read;
the mesh built from `config.mesh`, which checks its shape against the devices)
before anything is written or built, so that a mistake costs a second, not a
dataset build and a compile. The rules of the config alone
(`bert_jax.config_schema`) were applied before, at the command's start
(`launch/train.py`, a sweep's runs), so the values read here are checked.

They cover the names of the evaluators, the files and folders the config names
(`config.data.*path`, `*_file`, `*_files`, `init_from`, whose folder the trainer
is handed back; `check_files` alone serves launch/build_pretraining_data.py),
the model config the task declares (made without data where the task can), and
the global batch against the processes, the gradient-accumulation steps and the
mesh's data x fsdp devices (`check_batch` alone serves `launch/compile.py`, for
a target's mesh). Every problem is reported together, one line each, in one
`ConfigError`.
"""

from __future__ import annotations

import os
from typing import Iterator

import jax
import ml_collections
from jax.sharding import Mesh

from bert_jax.config_schema import refuse
from bert_jax.convert.pretrained import checkpoint_path
from bert_jax.evaluation import evaluators
from bert_jax.errors import ConfigError, MissingFileError
from bert_jax.tasks.base import Task

# Config fields (anywhere under `config.data`) that name files or folders that
# must exist; `init_from` is checked too. A `path:FORMAT` suffix is allowed.
PATH_SUFFIXES = ("path", "_file", "_files")


def check_training_config(task: Task, mesh: Mesh) -> str:
    """Raises `ConfigError` listing every problem found in `task`, the one the
    trainer will train on `mesh` (built from `config.mesh`, its shape checked
    then), and its config. With none, returns the folder `config.init_from` names
    ('' for none), resolved here once (`package:NAME` imports its package) for the
    trainer to restore from."""
    config = task.config
    batch = _batch_problems(task, mesh.shape["data"] * mesh.shape["fsdp"])
    problems = _name_problems(config)
    missing, init_from = _missing_files(config)
    problems += missing
    if not problems and not config.get("init_from"):  # else the checkpoint's model
        try:
            task.declared_model_config()  # None where the task learns it from its data
        except ConfigError as e:
            problems.extend(e.args)
    refuse(problems + batch)
    return init_from


def check_batch(task: Task, batch_shards: int) -> None:
    """The global batch's rules alone, against `batch_shards` devices (data x
    fsdp) of a mesh that may not be here (`bert_jax.planning.aot`)."""
    refuse(_batch_problems(task, batch_shards))


def _name_problems(config: ml_collections.ConfigDict) -> list[str]:
    """The evaluators the config names (registered by the evaluation package)."""
    evals = config.get("evals") or ()
    names = [evals] if isinstance(evals, str) else list(evals)
    unknown = [name for name in names if name not in evaluators.registered()]
    return [f"config.evals: unknown evaluator(s) {unknown}; registered: "
            f"{evaluators.registered()}."] if unknown else []


def _batch_problems(task: Task, batch_shards: int) -> list[str]:
    """Global batch and micro-batch against the devices that split the batch
    (mesh axes data x fsdp) and the processes that load it."""
    config = task.config
    try:
        rows = task.batch_rows
    except ConfigError as e:
        return list(e.args)
    field = ("config.data.batch_tokens // row length" if config.data.get("batch_tokens")
             else "config.train.batch_size")
    if rows < 1:
        return [f"{field}={rows}: must be at least 1."]
    accum = max(config.train.grad_accum_steps, 1)
    processes = jax.process_count()
    problems = []
    if rows % processes:
        problems.append(f"{field}={rows} is not divisible by the {processes} processes: "
                        "each loads the same share; use a multiple of "
                        f"{processes}.")
    if rows % accum:
        problems.append(f"{field}={rows} is not divisible by config.train.grad_accum_steps="
                        f"{accum}; use a multiple of {accum}.")
    elif (rows // accum) % batch_shards:
        need = batch_shards * accum
        nearest = sorted({max(rows // need, 1) * need, (rows // need + 1) * need})
        examples = " or ".join(map(str, nearest))
        micro = f"its micro-batches of {rows // accum} rows" if accum > 1 else "it"
        fewer = ", fewer config.train.grad_accum_steps" if accum > 1 else ""
        problems.append(
            f"{field}={rows}: {micro} cannot be split over the {batch_shards} devices "
            "of the mesh's data x fsdp axes (config.mesh.shape); use a multiple of "
            f"{need} ({'e.g. ' if len(nearest) == 1 else ''}{examples}){fewer}, or change "
            "the mesh.")
    return problems


def check_files(config: ml_collections.ConfigDict) -> None:
    """What a data build needs: the files and folders the config names exist."""
    refuse(_missing_files(config)[0], "the config names files that do not exist")


def _missing_files(config: ml_collections.ConfigDict) -> tuple[list[str], str]:
    """(the problems of the files and folders named, the folder `init_from` names:
    '' for none, or where it cannot be resolved)."""
    named, problems, init_from = list(_path_fields(config.data, "config.data")), [], ""
    try:  # `package:MODULE` names the folder a Python package ships
        init_from = checkpoint_path(config.get("init_from", ""))
        named.append(("config.init_from", init_from))
    except (ConfigError, MissingFileError) as e:  # no such package: how to install it
        problems.extend(e.args)  # its message
    return problems + [f"{field}={value!r}: no such file or folder; fix the path."
                       for field, value in named
                       if value and "://" not in value and not _exists(value)], init_from


def _path_fields(section: ml_collections.ConfigDict, prefix: str
                 ) -> Iterator[tuple[str, str]]:
    for key, value in section.items():
        field = f"{prefix}.{key}"
        if isinstance(value, ml_collections.ConfigDict):
            yield from _path_fields(value, field)
        elif key.endswith(PATH_SUFFIXES):
            for item in ((value,) if isinstance(value, str) else value or ()):
                yield field, item


def _exists(path: str) -> bool:
    """Whether `path`, or `path` without a `:FORMAT` suffix, exists."""
    return os.path.exists(path) or (":" in path and os.path.exists(path.rsplit(":", 1)[0]))
