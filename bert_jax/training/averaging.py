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
from bert_jax.training.workdir import (
    CHECKPOINT_DIR, CONFIG_FILE, checkpoint_steps, refuse_writing_into)


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
    `workdir`, written to the new folder `output` as the last of those steps."""
    directory = os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR)
    available = checkpoint_steps(directory)
    steps = available[-last:] if last > 0 else sorted(set(steps))
    if not steps or len(steps) < last or not set(steps) <= set(available):
        raise CheckpointError(
            f"cannot average {f'the last {last} checkpoints' if last else f'steps {steps}'}"
            f" of {directory}: it holds steps {available}. Name steps it holds (keep more "
            "with config.train.keep_last).")
    refuse_writing_into(f"--save_average={output}", output, {"--workdir": workdir})
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
    checkpointer = Checkpointer(output, async_saves=False)
    checkpointer.save(steps[-1], {"params": params}, None)
    checkpointer.close()
    if jax.process_index() == 0:
        shutil.copy(os.path.join(workdir, CONFIG_FILE), output)
        if os.path.isdir(os.path.join(workdir, VOCAB_DIR)):
            shutil.copytree(os.path.join(workdir, VOCAB_DIR), os.path.join(output, VOCAB_DIR))
        write_json(os.path.join(output, "average.json"),
                   {"workdir": os.path.abspath(workdir), "steps": steps})
    if jax.process_count() > 1:  # the folder is complete before any process reads it
        multihost_utils.sync_global_devices("average_written")
    return params, steps
