"""The one train loop: `train_and_evaluate(config, workdir)`.

Order of work for each step k (1-based, after the update):
  train step -> [log every `train.log_every`] -> [evaluate every `train.eval_every`]
  -> [checkpoint every `train.checkpoint_every`, at the end, or after SIGTERM or
  a first Ctrl-C (`preemption.PreemptionWatcher`)].

Exactness: randomness comes from (seed, step) only and the data iterator's
position is saved with the state, so a resumed run computes the same numbers
as one that never stopped. Non-finite losses or gradients are tracked on
device and checked before anything is logged or saved: the run stops naming
the first bad step, and the last checkpoint on disk is the last good one.

Fencing: before each metrics write, evaluator file and checkpoint save (a
preemption's included), and where an asynchronous save is committed, the
workdir's lock must still name this run (`WorkdirLock.lost`: host, pid and
token); once another run has it, this one stops at once, writing nothing more.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from absl import logging
from flax import traverse_util
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from bert_jax.config_schema import profile_range
from bert_jax.errors import TrainingDiverged, UserError
from bert_jax.file_io import read_json, write_json
from bert_jax.modeling.embeddings import tile_learned_positions
from bert_jax.tasks import Task, build_task
from bert_jax.tasks.base import check_saved_config, fill_saved_defaults
from bert_jax.training.checkpoints import (
    CheckpointError, Checkpointer, restore_params, set_aside_steps_after)
from bert_jax.training.device_prefetch import DevicePrefetch
from bert_jax.training.evaluation import make_evaluator
from bert_jax.training.metrics import (
    MetricWriter, Progress, log_progress, peak_flops_per_device)
from bert_jax.training.optimizer import optimizer_from_config
from bert_jax.training.preemption import PreemptionWatcher
from bert_jax.training.profiling import StepProfiler
from bert_jax.training.workdir import CONFIG_FILE, WorkdirError, check_step, check_workdir
from bert_jax.workdir_layout import CHECKPOINT_DIR, checkpoint_steps
from bert_jax.training.workdir_lock import DEFAULT_LOCK_TIMEOUT, WorkdirLock
from bert_jax.training.sharding import global_batch, mesh_from_config
from bert_jax.training.train_step import (
    TrainState, abstract_like, create_train_state, jit_train_step, make_train_step)
from bert_jax.training.validation import check_training_config

PROFILE_DIR = "profile"  # jax.profiler traces of config.train.profile_steps
# Config sections that define what a workdir's checkpoints are; the rest (step
# counts, logging, mesh) may change when a run is resumed.
IDENTITY_SECTIONS = ("task", "model", "data")


def config_to_json(config: ml_collections.ConfigDict) -> dict[str, Any]:
    return json.loads(config.to_json_best_effort())


def prepare_workdir(workdir: str, config: ml_collections.ConfigDict) -> str:
    """Creates `workdir`, checks it is writable and that a run already in it has
    the same task, model and data. (`write_config` writes `config.json` only once
    the run can start: a config that fails to build must leave none behind.)"""
    if "://" in workdir:
        raise WorkdirError(f"--workdir={workdir}: object-store URLs are not supported; mount "
                           "the bucket on every host (e.g. gcsfuse) and pass that path.")
    workdir = os.path.abspath(workdir)
    try:
        os.makedirs(workdir, exist_ok=True)
    except OSError as e:
        raise WorkdirError(f"cannot create --workdir={workdir}: {e.strerror}; choose a "
                           "writable location.") from e
    if not os.access(workdir, os.W_OK | os.X_OK):
        raise WorkdirError(f"--workdir={workdir} is not writable: fix its permissions or "
                           "choose another.")
    path = os.path.join(workdir, CONFIG_FILE)
    resolved = config_to_json(config)
    if os.path.exists(path):
        saved = read_json(path)
        check_saved_config(saved, path)
        fill_saved_defaults(saved)
        changed = _differences({k: saved.get(k) for k in IDENTITY_SECTIONS},
                               {k: resolved.get(k) for k in IDENTITY_SECTIONS})
        if changed:
            raise WorkdirError(
                f"--workdir={workdir} holds a run of an incompatible config:\n  "
                + "\n  ".join(changed)
                + "\nUse a new --workdir, or the saved config (" + path + ").")
    return workdir


def write_config(workdir: str, config: ml_collections.ConfigDict) -> None:
    if jax.process_index() == 0:  # atomically: other processes may be reading it
        write_json(os.path.join(workdir, CONFIG_FILE), config_to_json(config), sort_keys=True)


def _differences(old: dict, new: dict) -> list[str]:
    old, new = (traverse_util.flatten_dict(tree, sep=".") for tree in (old, new))
    return [f"{key}: {old.get(key)!r} in the workdir, {new.get(key)!r} now"
            for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)]


def initialise_from(state: TrainState, path: str, workdir: str,
                    tile_positions: int = 0) -> TrainState:
    """`state` with the parameters of checkpoint `path` (`config.init_from`, as
    `check_training_config` resolved it) where it has them (the rest as initialised;
    both listed in WORKDIR/init_from.json). `tile_positions` > 0: then the learned
    position rows from that one on are copies of the rows before it
    (`embeddings.tile_learned_positions`)."""
    restored, names, missing = restore_params(path, abstract_like(state.params))
    flat = traverse_util.flatten_dict(state.params)
    flat.update(traverse_util.flatten_dict(restored))
    params = traverse_util.unflatten_dict(flat)
    if tile_positions:
        params, tiled = tile_learned_positions(params, tile_positions)
        if not tiled:
            raise CheckpointError(f"config.init_tile_positions={tile_positions}: the model "
                                  f"of {path} has no learned position table longer than "
                                  "that; set it to 0")
    if jax.process_index() == 0:
        write_json(os.path.join(workdir, "init_from.json"),
                   {"init_from": path, "restored": names, "initialised": missing,
                    "tiled_positions_from": tile_positions})
    logging.info("init_from %s: %d parameters restored, %d initialised (%s)%s", path,
                 len(names), len(missing), ", ".join(missing) or "none",
                 f"; position rows from {tile_positions} on copied from the rows before"
                 if tile_positions else "")
    return state.replace(params=params)


def _restore_point(workdir: str, step: int) -> None:
    steps = checkpoint_steps(os.path.join(workdir, CHECKPOINT_DIR))
    if step not in steps:
        raise CheckpointError(f"--restore_step={step}: no such checkpoint in {workdir} "
                              f"(available: {steps}).")
    if jax.process_index() == 0:
        for path in set_aside_steps_after(workdir, step):
            logging.warning("--restore_step=%d: moved the later checkpoint %s aside (kept; "
                            "delete it when it is no longer needed).", step, path)
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("set_aside_checkpoints")


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       restore_step: int | None = None,
                       lock_timeout: float = DEFAULT_LOCK_TIMEOUT) -> dict[str, float]:
    """Trains `config` in `workdir`, resuming from its latest checkpoint or
    `restore_step` (later ones are moved to WORKDIR/checkpoints_set_aside/, their
    metrics dropped). Returns the last metrics logged. `lock_timeout`: seconds after
    which another host's lock on the workdir, not renewed, is taken over
    (`WorkdirLock`). The rules of the config alone are the caller's to apply first
    (`config_schema.check_config`, as launch/train.py and the sweeps do); what needs
    the task, the files or the devices is checked here (`check_training_config`)."""
    check_workdir(workdir)  # before anything reads or writes it
    check_step(workdir, restore_step, "restore_step")  # the step it resumes from
    mesh = mesh_from_config(config.mesh)  # its shape checked against the devices
    task = build_task(config, os.path.abspath(workdir))  # its data: read on first use
    init_from = check_training_config(task, mesh)  # '' or the folder it names
    workdir = prepare_workdir(workdir, task.config)  # its dtype resolved
    # The watcher closes last: no signal interrupts the final save or the lock's release.
    with PreemptionWatcher(first_step=None) as preemption:
        with _lock(workdir, lock_timeout) as lock:
            return _train(task, mesh, workdir, restore_step, lock, preemption, init_from)


def _lock(workdir: str, timeout: float) -> contextlib.AbstractContextManager:
    """The workdir's `WorkdirLock` on process 0 (a context without one on the others),
    or its refusal raised on every process."""
    lock, refused = contextlib.nullcontext(), None
    if jax.process_index() == 0:
        try:
            lock = WorkdirLock(workdir, timeout)
        except WorkdirError as e:
            refused = e
    _raise_everywhere(refused, f"{workdir} is in use by another run (process 0 names it).")
    return lock


def _raise_everywhere(error: UserError | None, elsewhere: str) -> None:
    """Raises process 0's `error` on every process (the others raise a `WorkdirError`
    saying `elsewhere`): what process 0 alone reads (the workdir's lock) stops all."""
    if jax.process_count() > 1 and multihost_utils.broadcast_one_to_all(error is not None):
        error = error or WorkdirError(elsewhere)
    if error:
        raise error


def _train(task: Task, mesh: Mesh, workdir: str, restore_step: int | None,
           lock: WorkdirLock | None, preemption: PreemptionWatcher, init_from: str
           ) -> dict[str, float]:
    if restore_step is not None:
        _restore_point(workdir, restore_step)
    config, train = task.config, task.config.train
    init_rng, step_rng = jax.random.split(jax.random.PRNGKey(config.seed))
    state, shardings = create_train_state(task.init_variables, task.model.apply,
                                          optimizer_from_config(config), mesh, init_rng)
    train_iter = DevicePrefetch(
        task.train_iterator(jax.process_index(), jax.process_count()),
        lambda batch: global_batch(batch, mesh), train.device_prefetch)
    # Opens the evaluation split now: a wrong one fails before training, not at
    # the first evaluation.
    task.eval_batches(jax.process_index(), jax.process_count())
    write_config(workdir, config)  # the task, its data and its model are built
    checkpointer = Checkpointer(workdir, keep_last=train.keep_last,
                                keep_best=train.keep_best, best_metric=train.best_metric,
                                best_mode=train.best_mode, async_saves=train.async_saves,
                                fence=lock.fence if lock else lambda: None)
    latest = checkpointer.latest_step()
    if latest is not None:
        state = checkpointer.restore(latest, abstract_like(state), train_iter)
        logging.info("resumed from %s/%d", checkpointer.directory, latest)
    elif init_from:
        state = initialise_from(state, init_from, workdir, config.get("init_tile_positions", 0))
    first_step = int(state.step)

    writer = MetricWriter(workdir, resume_step=first_step)
    step_fn = jit_train_step(make_train_step(task.loss_fn, train.grad_accum_steps,
                                             train.dropout_prng),
                             shardings, mesh)
    # The evaluators' files are written after `report` has seen the metrics: fenced.
    evaluate = make_evaluator(task, mesh, workdir, report=lambda _: fence())
    progress = Progress(total_steps=train.num_steps, first_step=first_step,
                        flops_per_step=task.flops_per_step(),
                        tokens_per_step=task.tokens_per_step(),
                        peak_flops=peak_flops_per_device(config.get("peak_flops", 0.0),
                                                         config.model.get("dtype", "float32")))
    preemption.begin(first_step)
    profile = profile_range(train.get("profile_steps"), "config.train.profile_steps")
    if profile and profile[0] <= first_step:
        logging.warning("config.train.profile_steps=%s: this run resumes after step %d, "
                        "so they are not profiled; choose later steps.", profile, first_step)
    profiler = StepProfiler(profile, os.path.join(workdir, PROFILE_DIR))
    first_bad = jnp.array(-1, jnp.int32)

    def check_finite():
        bad = int(first_bad)
        if bad >= 0:
            good = checkpointer.latest_step()
            fix = ("lower config.optimizer.learning_rate (or set "
                   "config.optimizer.max_grad_norm) and rerun")
            where = (f"The last good checkpoint is step {good} in {checkpointer.directory}; "
                     f"{fix} to resume from it, or from an earlier step with "
                     "--restore_step=N." if good is not None else
                     f"No checkpoint was saved before it; {fix}.")
            raise TrainingDiverged(
                f"loss or gradients became NaN/Inf at step {bad}; stopping. {where}")

    def fence() -> None:  # before each write into the workdir: the lock still names this run
        _raise_everywhere(lock and lock.lost(), f"{workdir}: process 0 lost the workdir's "
                          "lock to another run (its error names it); stopping.")

    def write_metrics(step: int, scalars: dict[str, float]) -> None:
        fence()
        writer.write(step, scalars)
        logged.update(scalars)

    def save(step: int, metrics: dict[str, float] | None = None) -> None:
        check_finite()  # never save a diverged state as the last good one
        fence()
        checkpointer.save(step, state, train_iter, metrics=metrics)

    logged: dict[str, float] = {}
    interrupted = False
    try:
        with jax.set_mesh(mesh):
            for step in range(first_step + 1, train.num_steps + 1):
                checkpointer.check()  # a failed asynchronous save stops the run here
                batch = next(train_iter)
                profiler.before(step)
                state, metrics = step_fn(state, batch, step_rng)
                profiler.after(step, metrics)
                finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"])
                first_bad = jnp.where((first_bad < 0) & ~finite, step, first_bad)
                last = step == train.num_steps
                scalars = {}
                if step % train.log_every == 0 or last:
                    check_finite()
                    scalars.update({f"train/{k}": float(v)
                                    for k, v in jax.device_get(metrics).items()})
                    scalars.update(progress.measure(step))
                    log_progress(step, train.num_steps, scalars)
                eval_metrics = None
                if step % train.eval_every == 0 or last:
                    try:
                        eval_metrics = evaluate(state.params, step)
                    except UserError:  # e.g. an evaluator the task cannot feed
                        save(step)  # keep the training
                        raise
                    progress.restart(step)  # evaluation time is not training time
                    scalars.update(eval_metrics)
                    logging.info("step %d eval: %s", step, eval_metrics)
                if scalars:
                    write_metrics(step, scalars)
                preempted = preemption.requested(step)
                if step % train.checkpoint_every == 0 or last or preempted:
                    save(step, eval_metrics)
                if preempted:
                    logging.warning("stopping after the preemption checkpoint at step %d.",
                                    step)
                    break
    except KeyboardInterrupt:   # a second Ctrl-C: stop now
        interrupted = True
        raise
    finally:
        profiler.close()
        train_iter.close()
        if not interrupted:  # the Ctrl-C may have landed inside tensorboardX's write of
            writer.close()   # a step: its writer thread would never finish, close() hang
        checkpointer.close()
    return logged
