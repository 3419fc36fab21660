"""Orbax checkpoints: async saves, exact resume, params-only restore.

Layout of a workdir's checkpoints (one folder per step):

    WORKDIR/checkpoints/<step>/state/   the TrainState (sharded arrays)
    WORKDIR/checkpoints/<step>/data/    the input iterator's state, per process

Kept: the last `keep_last` checkpoints plus the `keep_best` best by an
evaluation metric. A save interrupted by `kill -9` leaves a
`<step>.orbax-checkpoint-tmp*` folder that is never read: resuming takes the
last complete step.
"""

from __future__ import annotations

import functools
import glob
import os
import re
import shutil
from typing import Any, Iterator

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from orbax.checkpoint import checkpoint_managers

from bert_jax.errors import UserError
from bert_jax.training.workdir import CHECKPOINT_DIR, checkpoint_steps

SET_ASIDE_DIR = "checkpoints_set_aside"


class CheckpointError(UserError, RuntimeError):
    """A checkpoint cannot be read or does not fit; the message names it."""


class DamagedCheckpointError(CheckpointError):
    """A checkpoint's files cannot be read; `rerun_with` holds the flag that
    resumes from the last earlier step (None: there is none)."""


class Checkpointer:
    """One CheckpointManager for the train state and the data iterator."""

    def __init__(self, workdir: str, *, keep_last: int = 2, keep_best: int = 0,
                 best_metric: str = "eval/loss", best_mode: str = "min",
                 async_saves: bool = True, read_only: bool = False):
        self.directory = os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR)
        policies = [checkpoint_managers.LatestN(n=keep_last)]
        if keep_best:
            if best_mode not in ("min", "max"):
                raise ValueError(f"best_mode={best_mode!r}: use 'min' or 'max'.")
            policies.append(checkpoint_managers.BestN(
                get_metric_fn=lambda metrics: metrics[best_metric],
                reverse=best_mode == "min", n=keep_best,
                keep_checkpoints_without_metrics=False))
        options = ocp.CheckpointManagerOptions(
            preservation_policy=checkpoint_managers.AnyPreservationPolicy(policies),
            enable_async_checkpointing=async_saves,
            create=not read_only,
            read_only=read_only,
        )
        self.manager = ocp.CheckpointManager(self.directory, options=options,
                                             item_names=("state", "data"))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def save(self, step: int, state: Any, data_iterator: grain.DatasetIterator | None,
             metrics: dict[str, float] | None = None) -> None:
        """Starts an (asynchronous) save of `state` and the iterator position."""
        items = {"state": ocp.args.StandardSave(state)}
        if data_iterator is not None:
            items["data"] = grain.checkpoint.CheckpointSave(data_iterator)
        self.manager.save(step, args=ocp.args.Composite(**items), metrics=metrics,
                          force=True)

    def restore(self, step: int, abstract_state: Any,
                data_iterator: grain.DatasetIterator | None) -> Any:
        """The state at `step`, laid out as `abstract_state`'s shardings; the
        iterator is moved to where it was when that step was saved."""
        items = {"state": ocp.args.StandardRestore(abstract_state)}
        if data_iterator is not None:
            items["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
        try:
            restored = self.manager.restore(step, args=ocp.args.Composite(**items))
        except Exception as e:  # Orbax/TensorStore raise many types
            raise self._unrestorable(step, e) from e
        return restored["state"]

    def _unrestorable(self, step: int, error: Exception) -> CheckpointError:
        """The error for a step that cannot be restored: the damaged array and
        file when TensorStore names them, and the earlier step to resume from."""
        where = f"cannot restore {self.directory}/{step}: "
        steps = self.all_steps()
        earlier = max((s for s in steps if s < step), default=None)
        damage = describe_damage(error)
        if damage is None:
            return CheckpointError(
                where + f"{type(error).__name__}: {error}\nThe checkpoint is corrupted or "
                "was written by a different model (compare config.json). Nothing was "
                f"deleted: restore an earlier step (available: {steps}) or start a new "
                "workdir.")
        advice = ("start a new workdir (no earlier step to resume from)" if earlier is None
                  else f"resume from step {earlier}, the last earlier checkpoint, with "
                  f"--restore_step={earlier}")
        return DamagedCheckpointError(
            where + damage + f"\nNothing was deleted (available: {steps}): {advice}.",
            rerun_with=None if earlier is None else {"restore_step": earlier})

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


_TENSORSTORE_READ = re.compile(
    r'Error reading "(?P<array>[^"]+?)(?:/[\d.]+)?" in OCDBT database at local file '
    r'"(?P<database>[^"]+)"(?::\s*(?P<reason>[^\n]*))?')
_VALUE_SIZE = re.compile(r"for value of size (\d+)")


def describe_damage(error: BaseException) -> str | None:
    """'array NAME cannot be read (REASON)[; damaged (truncated) file: PATH]' from the
    TensorStore read error in `error`'s chain, or None if there is none.

    TensorStore names the array and the checkpoint, not the data file; a read
    past the end of a truncated file reports the file's size, which finds it.
    """
    for cause in _chain(error):
        found = _TENSORSTORE_READ.search(str(cause))
        if not found:
            continue
        message = f"array {found['array']} cannot be read ({found['reason'] or cause})"
        size = _VALUE_SIZE.search(found["reason"] or "")
        data_files = glob.glob(os.path.join(found["database"], "**", "d", "*"),
                               recursive=True)
        files = [path for path in data_files
                 if size and os.path.getsize(path) == int(size.group(1))]
        if files:
            return message + f"; damaged (truncated) file: {', '.join(sorted(files))}"
        return message + (f"; a data file under {found['database']}*/d/ is damaged or "
                          "missing")
    return None


def _chain(error: BaseException | None) -> Iterator[BaseException]:
    """`error` and its causes and contexts, outermost first."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def set_aside_steps_after(workdir: str, step: int) -> list[str]:
    """Moves the checkpoints of steps after `step` to WORKDIR/checkpoints_set_aside/
    (never deletes them), so that a run resumed from `step` saves its own.
    Returns their new locations. Call on process 0 only, before a Checkpointer
    exists."""
    moved = []
    for later_step in (s for s in checkpoint_steps(os.path.join(workdir, CHECKPOINT_DIR)) if s > step):
        target = os.path.join(os.path.abspath(workdir), SET_ASIDE_DIR, str(later_step))
        suffix = 1
        while os.path.exists(target):
            target = os.path.join(os.path.dirname(target), f"{later_step}.{suffix}")
            suffix += 1
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.move(os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR, str(later_step)),
                    target)
        moved.append(target)
    return moved


def reports_damage(restore: Any) -> Any:
    """Decorates a restore function: a TensorStore read error (a damaged or
    missing data file) becomes a DamagedCheckpointError naming the array and file."""
    @functools.wraps(restore)
    def wrapped(path, *args, **kwargs):
        try:
            return restore(path, *args, **kwargs)
        except CheckpointError:
            raise
        except Exception as e:
            damage = describe_damage(e)
            if damage is None:
                raise
            raise DamagedCheckpointError(
                f"cannot restore {path}: {damage}\nNothing was deleted: use another of its "
                "checkpoints (--step=N in evaluate.py and translate.py; as init_from, the "
                "folder WORKDIR/checkpoints/N) or retrain.") from e
    return wrapped


def _params_location(path: str) -> tuple[str, tuple[str, ...]]:
    """(Orbax item directory, key path of the params inside it) for `path`: a
    bert_jax pretrained folder, a workdir, its checkpoints dir, or one step."""
    path = os.path.abspath(path)
    if os.path.isfile(os.path.join(path, "model_config.json")):
        return os.path.join(path, "params"), ()
    if os.path.isdir(os.path.join(path, CHECKPOINT_DIR)):
        path = os.path.join(path, CHECKPOINT_DIR)
    if os.path.isdir(os.path.join(path, "state")):
        return os.path.join(path, "state"), ("params",)
    steps = checkpoint_steps(path)
    if not steps:
        raise CheckpointError(
            f"{path} holds no checkpoint: expected a bert_jax pretrained folder, a "
            "workdir with checkpoints/, or one checkpoint step folder.")
    return os.path.join(path, str(steps[-1]), "state"), ("params",)


def _match(saved_shapes: dict[tuple[str, ...], tuple[int, ...]], wanted: dict,
           prefix: tuple[str, ...], where: str, strict: bool
           ) -> tuple[dict, list[str], list[str]]:
    """(wanted entries the checkpoint has, their paths, missing paths).

    A parameter with another shape is an error naming it; with `strict`, so
    are parameters the checkpoint lacks or has beyond the model's."""
    target, restored_paths, missing, mismatched = {}, [], [], []
    for key, spec in wanted.items():
        saved_key = prefix + key
        if saved_key not in saved_shapes:
            missing.append("/".join(key))
        elif tuple(saved_shapes[saved_key]) != tuple(spec.shape):
            mismatched.append(f"{'/'.join(key)}: checkpoint {tuple(saved_shapes[saved_key])}"
                              f" vs model {tuple(spec.shape)}")
        else:
            target[saved_key] = spec
            restored_paths.append("/".join(key))
    unexpected = sorted("/".join(k[len(prefix):]) for k in saved_shapes
                        if k[:len(prefix)] == prefix and k[len(prefix):] not in wanted)
    problems = [("mis-shaped parameters", mismatched)]
    if strict:
        problems += [("parameters the checkpoint lacks", missing),
                     ("parameters the model does not have", unexpected)]
    if any(names for _, names in problems):
        raise CheckpointError(
            f"{where} was written by a different model than this config's:\n"
            + "\n".join(f"  {title} ({len(names)}): " + ", ".join(names[:12])
                        + (", ..." if len(names) > 12 else "")
                        for title, names in problems if names)
            + "\nRestore it with the config it was trained with (its workdir's "
              "config.json).")
    return target, restored_paths, missing


def _is_huggingface_folder(path: str) -> bool:
    return all(os.path.isfile(os.path.join(path, name))
               for name in ("config.json", "model.safetensors"))


def _restore_huggingface(path: str, abstract_params: Any, strict: bool):
    """`restore_params` for a Hugging Face BERT folder (safetensors, never pickles)."""
    from flax import traverse_util

    from bert_jax.convert.hf_bert import load_hf_bert

    _, params = load_hf_bert(path)
    saved = traverse_util.flatten_dict(params)
    target, restored_paths, missing = _match(
        {k: np.shape(v) for k, v in saved.items()},
        traverse_util.flatten_dict(abstract_params), (), path, strict)

    def place(value, spec):  # every process builds its own shards
        value = np.asarray(value, spec.dtype)
        return jax.make_array_from_callback(spec.shape, spec.sharding, lambda i: value[i])

    restored = {key: place(saved[key], spec) for key, spec in target.items()}
    return traverse_util.unflatten_dict(restored), restored_paths, missing


@reports_damage
def restore_params(path: str, abstract_params: Any, strict: bool = False
                   ) -> tuple[Any, list[str], list[str]]:
    """Restores the parameters of `abstract_params` that `path` holds.

    `path`: a bert_jax pretrained folder, a workdir, its checkpoints dir, one
    step, or a Hugging Face BERT folder (`config.json` + `model.safetensors`).
    `abstract_params` is a tree of `jax.ShapeDtypeStruct` with shardings (the new
    model's). Parameters the checkpoint lacks (a head the new task adds) are
    left out of the result for the caller to initialise (the params-only
    `init_from` path); a parameter present in both with different shapes is an
    error naming it. `strict=True` (restoring a model for inference) also
    refuses missing and unexpected parameters, naming them.

    Returns (restored subtree, restored paths, missing paths).
    """
    from flax import traverse_util

    if _is_huggingface_folder(path):
        return _restore_huggingface(path, abstract_params, strict)
    directory, prefix = _params_location(path)
    checkpointer = ocp.PyTreeCheckpointer()
    try:
        metadata = checkpointer.metadata(directory)
        saved_tree = metadata.item_metadata.tree if hasattr(
            metadata, "item_metadata") else metadata.tree
    except Exception as e:
        raise CheckpointError(f"cannot read checkpoint metadata in {directory}: {e}") from e
    saved = traverse_util.flatten_dict(saved_tree)
    target, restored_paths, missing = _match(
        {k: v.shape for k, v in saved.items() if hasattr(v, "shape")},
        traverse_util.flatten_dict(abstract_params),
        prefix, directory, strict)
    item = traverse_util.unflatten_dict(target)
    restore_args = jax.tree.map(
        lambda s: ocp.ArrayRestoreArgs(sharding=s.sharding, global_shape=s.shape,
                                       dtype=s.dtype), item)
    restored = checkpointer.restore(directory, args=ocp.args.PyTreeRestore(
        item=item, restore_args=restore_args, partial_restore=True))
    for key in prefix:
        restored = restored[key]
    logging.info("restored %d parameters from %s; %d initialised: %s",
                 len(restored_paths), path, len(missing), missing)
    return restored, restored_paths, missing
