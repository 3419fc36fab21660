"""Orbax checkpoints: async saves, exact resume, params-only restore.

Layout of a workdir's checkpoints (one folder per step):

    WORKDIR/checkpoints/<step>/state/   the TrainState (sharded arrays)
    WORKDIR/checkpoints/<step>/data/    the input iterator's state, per process
    WORKDIR/checkpoints/<step>/digest/  a checksum of each array of the state

Integrity is checked whole or the checkpoint is refused: a missing or damaged
checksum record is damage, as a checksum that differs is. Only a step whose
Orbax record of its items (`_CHECKPOINT_METADATA`) lists no digest (saved
before checksums were, 2026-11-25) is restored unchecked, with a warning.

Kept: the last `keep_last` checkpoints plus the `keep_best` best by an
evaluation metric. The trainer checks its lock before each save; `fence` checks
it again where an asynchronous save is committed (just before Orbax renames the
finished step into place), so that a save in flight when the run lost its workdir
is never committed, nor are older steps deleted for it. A save interrupted by
`kill -9` leaves a `<step>.orbax-checkpoint-tmp*` folder that is never read:
resuming takes the last complete step.
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Any, Callable

import grain
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from orbax.checkpoint import checkpoint_managers

from bert_jax import noise
from bert_jax.errors import CheckpointError, DamagedFileError, UserError, chain
from bert_jax.file_io import read_json
from bert_jax.workdir_layout import CHECKPOINT_DIR, checkpoint_steps, is_step_name

SET_ASIDE_DIR = "checkpoints_set_aside"
DIGEST_ITEM = "digest"
STEP_RECORD = "_CHECKPOINT_METADATA"  # Orbax's: {"item_handlers": {item: handler}, ...}


_TENSORSTORE_ERROR_CODE = re.compile(r"os_error_code=\\*'?(\d+)")


def _os_error_code(error: BaseException) -> int | None:
    """The errno behind `error`: an OSError's own, or the code TensorStore writes into
    its message (`[os_error_code='27']`); None if it has neither. Only the code is
    reported, so a save's error stays one line whatever the foreign text holds."""
    if isinstance(error, OSError) and isinstance(error.errno, int):
        return error.errno
    found = _TENSORSTORE_ERROR_CODE.search(str(error))
    return int(found.group(1)) if found else None


class Checkpointer:
    """One CheckpointManager for the train state and the data iterator. `fence`: raises
    a `UserError` when this run may no longer write in the workdir (see the module
    docstring); `save` and `check` raise that error, not a failed save's."""

    def __init__(self, workdir: str, *, keep_last: int = 2, keep_best: int = 0,
                 best_metric: str = "eval/loss", best_mode: str = "min",
                 async_saves: bool = True, read_only: bool = False,
                 fence: Callable[[], None] = lambda: None):
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
            # Runs on process 0 after the items are written, before the step's rename.
            async_options=ocp.AsyncOptions(post_finalization_callback=fence)
            if async_saves else None,
            create=not read_only,
            read_only=read_only,
        )
        self.manager = ocp.CheckpointManager(self.directory, options=options,
                                             item_names=("state", "data", DIGEST_ITEM))
        self.unchecked = None  # the step of the last save not yet known to be complete
        self.failed = False
        noise.drop_unraisable_io_errors()

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def save(self, step: int, state: Any, data_iterator: grain.DatasetIterator | None,
             metrics: dict[str, float] | None = None) -> None:
        items = {"state": ocp.args.StandardSave(state),
                 DIGEST_ITEM: ocp.args.JsonSave(digests(state)[0])}
        if data_iterator is not None:
            items["data"] = grain.checkpoint.CheckpointSave(data_iterator)
        self.check(wait=True)  # the previous save's error is the previous save's
        self.unchecked = step
        try:
            self.manager.save(step, args=ocp.args.Composite(**items), metrics=metrics,
                              force=True)
        except Exception as e:
            raise self._unsaved(e) from e

    def check(self, wait: bool = False) -> None:
        """Raises a CheckpointError if the last save failed; without `wait`, only once it
        has finished (cheap: call it at every step) and with one process (several
        must stop at the same step: the next save's)."""
        if self.unchecked is None or not wait and (
                jax.process_count() > 1 or self.manager.is_saving_in_progress()):
            return
        try:
            self.manager.wait_until_finished()
        except Exception as e:
            raise self._unsaved(e) from e
        if not os.path.isdir(os.path.join(self.directory, str(self.unchecked))):
            raise self._unsaved(None)  # Orbax logged why; the step was not finalised
        self.unchecked = None

    def _unsaved(self, error: Exception | None) -> UserError:
        """The error of a save that failed: the fence's, when it stopped the save."""
        step, self.unchecked, self.failed = self.unchecked, None, True
        noise.drop_reports_of_abandoned_io()
        fenced = next((e for e in chain(error) if isinstance(e, UserError)), None)
        if fenced:
            return fenced
        code = next(filter(None, map(_os_error_code, chain(error))), None)
        reason = f" ({os.strerror(code)})" if code else ""
        usage = shutil.disk_usage(self.directory)
        free, total = (f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"
                       for n in (usage.free, usage.total))
        previous = max((s for s in checkpoint_steps(self.directory) if s < step), default=None)
        return CheckpointError(
            f"cannot save the checkpoint of step {step} in {self.directory}{reason}; "
            f"{free} free of {total} there (--debug shows Orbax's error). Earlier "
            "checkpoints are intact: make room or fix the permissions, then rerun the same "
            "command to " + (f"resume from step {previous}." if previous is not None
                             else "start again."))

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
            noise.drop_reports_of_abandoned_io()
            raise self._unrestorable(step, UNREADABLE) from e
        damage = checkpoint_damage(os.path.join(self.directory, str(step)), restored["state"])
        if damage:
            raise self._unrestorable(step, damage)
        return restored["state"]

    def _unrestorable(self, step: int, damage: str) -> CheckpointError:
        steps = self.all_steps()
        earlier = max((s for s in steps if s < step), default=None)
        advice = ("start a new workdir (no earlier step to resume from)" if earlier is None
                  else f"resume from step {earlier}, the last earlier checkpoint, with "
                  f"--restore_step={earlier}")
        return CheckpointError(
            f"cannot restore {self.directory}/{step}: {damage}\nNothing was deleted "
            f"(available: {steps}): {advice}.", damaged=True,
            rerun_with=None if earlier is None else {"restore_step": earlier})

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        """Waits for the last save (a CheckpointError if it failed)."""
        try:
            self.check(wait=True)
        finally:
            try:
                self.manager.close()
            except Exception:  # Orbax raises a failed save again: it was reported
                if not self.failed:
                    raise


@jax.jit
def _checksums(leaves: list) -> list:
    """(checksum, all finite) of each array, on device and independent of the
    sharding: the sum, mod 2**32, of its elements' bits times (2 * index + 1)."""
    out = []
    for x in leaves:
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        bits = (x.astype(jnp.uint32) if x.dtype == bool else jax.lax.bitcast_convert_type(
            x, {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[x.dtype.itemsize]
        ).astype(jnp.uint32))
        index = jnp.zeros(bits.shape, jnp.uint32)
        for axis, size in enumerate(bits.shape):  # no reshape: it would gather shards
            index = index * size + jax.lax.broadcasted_iota(jnp.uint32, bits.shape, axis)
        finite = jnp.all(jnp.isfinite(x)) if jnp.issubdtype(x.dtype, jnp.inexact) else True
        out.append((jnp.sum(bits * (2 * index + 1), dtype=jnp.uint32), finite))
    return out


def digests(tree: Any) -> tuple[dict[str, int], list[str]]:
    """({array name: checksum}, names of arrays holding NaN or Inf) of `tree`."""
    named = jax.tree_util.tree_flatten_with_path(tree)[0]
    results = jax.device_get(_checksums([leaf for _, leaf in named]))
    names = [jax.tree_util.keystr(path, simple=True, separator="/") for path, _ in named]
    return ({name: int(total) for name, (total, _) in zip(names, results)},
            [name for name, (_, finite) in zip(names, results) if not finite])


def check_integrity(tree: Any, saved: dict[str, int] | None) -> str | None:
    """What is wrong with restored `tree`: an array whose checksum differs from
    the one `saved` with it (same-size damage that TensorStore reads without
    error) or that `saved` lacks, or that holds NaN/Inf (training never saves
    one); None if nothing. `saved=None`: no checksums (NaN/Inf only)."""
    computed, nonfinite = digests(tree)
    unrecorded = [name for name in computed if saved is not None and name not in saved]
    changed = [name for name, total in computed.items()
               if saved is not None and name in saved and saved[name] != total]
    for names, what in ((unrecorded, "has no checksum in the record saved with it"),
                        (changed, "does not match the checksum saved with it"),
                        (nonfinite, "holds NaN or Inf")):
        if names:
            more = f" (and {len(names) - 1} more)" if len(names) > 1 else ""
            return f"array {names[0]}{more} {what}: the checkpoint is damaged"
    return None


def checkpoint_damage(step_dir: str, tree: Any) -> str | None:
    """What is wrong with `tree`, restored from the checkpoint `step_dir`
    (WORKDIR/checkpoints/N), checked against the checksums saved with it; None if
    nothing. Unchecked only when the step's Orbax record of its items says its
    writer saved no checksums; a missing or damaged record is damage."""
    try:
        items = read_json(os.path.join(step_dir, STEP_RECORD))["item_handlers"]
        checked = DIGEST_ITEM in items
    except (OSError, DamagedFileError, LookupError, TypeError):
        return (f"{STEP_RECORD}, its record of what it holds, is missing or damaged: its "
                "checksums cannot be found")
    if not checked:
        logging.warning("%s was saved without checksums (before bert_jax recorded them): "
                        "its arrays are restored unchecked.", step_dir)
        return check_integrity(tree, None)
    try:
        saved = ocp.Checkpointer(ocp.JsonCheckpointHandler()).restore(
            os.path.join(step_dir, DIGEST_ITEM))
    except Exception:  # Orbax raises FileNotFoundError, JSONDecodeError, ...
        saved = None
    if not isinstance(saved, dict):
        return f"its checksums ({DIGEST_ITEM}/) are missing or damaged"
    return check_integrity(tree, saved)


UNREADABLE = "its files cannot be read (--debug shows Orbax's error)"


def set_aside_steps_after(workdir: str, step: int) -> list[str]:
    """Moves (never deletes) the checkpoints after `step` to WORKDIR/checkpoints_set_aside/,
    so that a run resumed from `step` saves its own; returns where they went. Process 0
    only, before a Checkpointer exists."""
    moved = []
    workdir = os.path.abspath(workdir)
    for later_step in checkpoint_steps(os.path.join(workdir, CHECKPOINT_DIR)):
        if later_step <= step:
            continue
        target = os.path.join(workdir, SET_ASIDE_DIR, str(later_step))
        suffix = 1
        while os.path.exists(target):
            target = os.path.join(os.path.dirname(target), f"{later_step}.{suffix}")
            suffix += 1
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.move(os.path.join(workdir, CHECKPOINT_DIR, str(later_step)), target)
        moved.append(target)
    return moved


def vanished_step(directory: str, step: int, flag: str | None) -> CheckpointError | None:
    """The error for checkpoint `step` of the checkpoints folder `directory` deleted while
    it was read (a training run writing there keeps its last `train.keep_last`), naming
    the steps there now and `--FLAG` for the latest; None while the step is there."""
    if os.path.isdir(os.path.join(directory, str(step))):
        return None
    now = checkpoint_steps(directory)
    return CheckpointError(
        f"checkpoint {step} vanished from {directory} while it was being read: a training "
        "run writing there deletes all but its last config.train.keep_last checkpoints. "
        f"It holds {now} now: rerun to read the latest"
        + (f" (--{flag}=N for another)." if flag else "."),
        rerun_with={flag: now[-1]} if flag and now else None)


def _damaged(path: str, damage: str, step_flag: str | None = None) -> CheckpointError:
    """The error for the damaged checkpoint `path`; with `step_flag`, when `path` is a step
    folder (DIR/N) after another step of DIR, naming the last earlier one and the flag."""
    directory, name = os.path.split(os.path.abspath(path))
    steps = checkpoint_steps(directory) if step_flag and is_step_name(name) else []
    earlier = max((s for s in steps if s < int(name)), default=None)
    if earlier is not None:
        return CheckpointError(
            f"cannot restore {path}: {damage}\nNothing was deleted (available: {steps}): use "
            f"step {earlier}, the last earlier checkpoint, with --{step_flag}={earlier}.",
            damaged=True, rerun_with={step_flag: earlier})
    return CheckpointError(
        f"cannot restore {path}: {damage}\nNothing was deleted: use another of its "
        "checkpoints (--step=N in evaluate.py and translate.py; as init_from, the "
        "folder WORKDIR/checkpoints/N) or retrain.", damaged=True)


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
    """(wanted entries the checkpoint has, their paths, missing paths); see
    `restore_params` for what is an error."""
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


def restore_params(path: str, abstract_params: Any, strict: bool = False,
                   step_flag: str | None = None) -> tuple[Any, list[str], list[str]]:
    """(restored subtree, restored paths, missing paths) of the parameters of
    `abstract_params` (ShapeDtypeStructs with the new model's shardings) that `path`
    holds: a bert_jax pretrained folder, a workdir, its checkpoints dir, one step,
    or a Hugging Face BERT folder. Missing ones (a head the new task adds) are left
    to the caller (`init_from`); mis-shaped ones are an error, and with `strict`
    (inference) missing and unexpected ones too. A damaged step folder's error names
    `--step_flag`=the last earlier step (`rerun_with`), when there is one."""
    from flax import traverse_util

    if all(os.path.isfile(os.path.join(path, name))   # a Hugging Face BERT folder
           for name in ("config.json", "model.safetensors")):
        return _restore_huggingface(path, abstract_params, strict)
    directory, prefix = _params_location(path)
    checkpointer = ocp.PyTreeCheckpointer()
    noise.drop_unraisable_io_errors()
    try:
        metadata = checkpointer.metadata(directory)
        saved_tree = metadata.item_metadata.tree if hasattr(
            metadata, "item_metadata") else metadata.tree
    except Exception as e:  # Orbax: None for a damaged _METADATA, or any error
        raise _damaged(path, f"the metadata of {directory} cannot be read (--debug shows "
                       "Orbax's error)", step_flag) from e
    saved = traverse_util.flatten_dict(saved_tree)
    target, restored_paths, missing = _match(
        {k: v.shape for k, v in saved.items() if hasattr(v, "shape")},
        traverse_util.flatten_dict(abstract_params),
        prefix, directory, strict)
    item = traverse_util.unflatten_dict(target)
    restore_args = jax.tree.map(
        lambda s: ocp.ArrayRestoreArgs(sharding=s.sharding, global_shape=s.shape,
                                       dtype=s.dtype), item)
    try:
        restored = checkpointer.restore(directory, args=ocp.args.PyTreeRestore(
            item=item, restore_args=restore_args, partial_restore=True))
    except Exception as e:  # the metadata and shapes matched: the data files are damaged
        noise.drop_reports_of_abandoned_io()
        raise _damaged(path, UNREADABLE, step_flag) from e
    damage = (checkpoint_damage(os.path.dirname(directory), restored) if prefix  # a step
              else check_integrity(restored, None))  # a pretrained folder has no checksums
    if damage:
        raise _damaged(path, damage, step_flag)
    for key in prefix:
        restored = restored[key]
    logging.info("restored %d parameters from %s; %d initialised: %s",
                 len(restored_paths), path, len(missing), missing)
    return restored, restored_paths, missing
