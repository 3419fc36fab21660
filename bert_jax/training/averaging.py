"""Checkpoint averaging, as the Transformer paper reports its results (Vaswani
et al. 2017, section 6.1: the last 5 checkpoints, written every 10 minutes, for
the base model, the last 20 for big; fairseq scripts/average_checkpoints.py,
tensor2tensor/utils/avg_checkpoints.py). The average is written to a new
folder outside the workdir (symbolic links followed), a workdir of its own that
evaluate.py, translate.py and `init_from` read; the training run's workdir is
not written to:

    OUTPUT/config.json, OUTPUT/vocab/      copied from the workdir
    OUTPUT/checkpoints/<last step>/state   {"params": the average}
    OUTPUT/checkpoints/<last step>/digest  its checksums (checkpoints.Checkpointer)
    OUTPUT/average.json                    {"workdir": ..., "steps": [averaged]}
"""

from __future__ import annotations

import contextlib
import os
import shutil
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections
from jax.experimental import multihost_utils

from bert_jax.data.vocabulary import VOCAB_DIR
from bert_jax.file_io import write_json
from bert_jax.training.checkpoints import (
    CheckpointError, Checkpointer, restore_params, vanished_step)
from bert_jax.training.evaluation import abstract_params
from bert_jax.training.workdir import CONFIG_FILE, check_step, refuse_writing_into
from bert_jax.workdir_layout import CHECKPOINT_DIR, checkpoint_steps


def average_params(paths: Sequence[str], abstract: Any) -> Any:
    """The mean of the parameters at `paths`, laid out as `abstract` (ShapeDtypeStructs
    with shardings): summed in float32 on the devices, divided once and cast back to
    each leaf's dtype (bfloat16 is rounded once). Restores are strict."""
    as_float32 = jax.tree.map(lambda s: s.update(dtype=jnp.float32), abstract)
    total = None
    for path in paths:
        params, _, _ = restore_params(path, as_float32, strict=True)
        total = params if total is None else jax.tree.map(jnp.add, total, params)
    return jax.tree.map(lambda t, s: (t / len(paths)).astype(s.dtype), total, abstract)


def average_workdir(config: ml_collections.ConfigDict, workdir: str, output: str,
                    steps: Sequence[int] = (), last: int = 0) -> tuple[Any, list[int]]:
    """(the average, the steps averaged) of `steps`, or the `last` N checkpoints, of
    `workdir`, written to the new folder `output` as the last of those steps: first to
    OUTPUT.partial, which claims it (a second command averaging into OUTPUT meanwhile is
    refused) and is removed if anything fails, then renamed to `output` when complete."""
    directory = os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR)
    available = checkpoint_steps(directory)
    steps = available[-last:] if last > 0 else sorted(set(steps))
    if not steps or len(steps) < last or not set(steps) <= set(available):
        raise CheckpointError(
            f"cannot average {f'the last {last} checkpoints' if last else f'steps {steps}'}"
            f" of {directory}: it holds steps {available}. Name steps it holds (keep more "
            "with config.train.keep_last).")
    for step in steps:
        check_step(workdir, step, None)
    refuse_writing_into({f"--save_average={output}": output}, {"--workdir": workdir})
    if os.path.exists(output) and (os.path.isfile(output) or os.listdir(output)):
        raise CheckpointError(f"--save_average={output} is not a new folder: the average is "
                              "never written over other files. Choose a new folder.")
    output = os.path.abspath(output)
    _, _, abstract = abstract_params(config, workdir)
    try:
        params = average_params([os.path.join(directory, str(s)) for s in steps], abstract)
    except CheckpointError as e:
        vanished = next(filter(None, (vanished_step(directory, s, None) for s in steps)), None)
        if vanished:
            raise vanished from e
        raise
    with _claimed(output) as partial:
        checkpointer = Checkpointer(partial, async_saves=False)
        checkpointer.save(steps[-1], {"params": params}, None)
        checkpointer.close()
        if jax.process_index() == 0:
            shutil.copy(os.path.join(workdir, CONFIG_FILE), partial)
            if os.path.isdir(os.path.join(workdir, VOCAB_DIR)):
                shutil.copytree(os.path.join(workdir, VOCAB_DIR),
                                os.path.join(partial, VOCAB_DIR))
            write_json(os.path.join(partial, "average.json"),
                       {"workdir": os.path.abspath(workdir), "steps": steps})
    if jax.process_count() > 1:  # the folder is complete before any process reads it
        multihost_utils.sync_global_devices("average_written")
    return params, steps


@contextlib.contextmanager
def _claimed(output: str):
    """OUTPUT.partial, made by process 0 (refused when it exists: another command is
    writing the average, or was stopped), renamed to `output` (new or empty) after the
    block, removed when the block or the rename fails: nothing half-written stays."""
    partial = output + ".partial"
    if jax.process_index() == 0:
        try:
            os.mkdir(partial)
        except FileExistsError:
            raise CheckpointError(
                f"{partial} exists: another command is writing --save_average={output}, or "
                "one was stopped. When none runs, delete it and rerun.") from None
    try:
        yield partial
        if jax.process_index() == 0:
            os.rename(partial, output)  # onto an empty folder too; atomic
    except BaseException as e:
        if jax.process_index() == 0:
            shutil.rmtree(partial, ignore_errors=True)
        if isinstance(e, OSError):
            raise CheckpointError(f"--save_average={output}: cannot write it "
                                  f"({e.strerror}); nothing of it is left. Make room or "
                                  "choose another folder.") from e
        raise
