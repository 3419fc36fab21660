"""The files of a run directory: the runner's JSON records, the trainer's
metrics and checkpoints, the DONE marker, and the parameter count."""

from __future__ import annotations

import datetime
import os
from typing import Any

from bert_jax.errors import DamagedFileError
from bert_jax.file_io import read_json
from bert_jax.training.workdir import CHECKPOINT_DIR, checkpoint_steps

SWEEP_FILE = "sweep.json"
OVERRIDES_FILE = "overrides.json"
RUN_FILE = "run.json"
DONE_FILE = "DONE"


def read_record(path: str) -> Any:
    """The JSON file at `path`, or None when it is absent or unreadable."""
    try:
        return read_json(path)
    except (OSError, DamagedFileError):
        return None


def run_checkpoint_steps(workdir: str) -> list[int]:
    """Steps of the complete checkpoints of a run."""
    return checkpoint_steps(os.path.join(workdir, CHECKPOINT_DIR))


def is_finished(workdir: str, num_steps: int) -> bool:
    """A DONE marker for at least `num_steps`, or a checkpoint of that step."""
    done = read_record(os.path.join(workdir, DONE_FILE))
    if isinstance(done, dict) and int(done.get("num_steps", -1)) >= num_steps:
        return True
    return any(step >= num_steps for step in run_checkpoint_steps(workdir))


def count_parameters(config: Any, workdir: str) -> int:
    """The model's parameter count, from shapes only (`jax.eval_shape` of the
    task's `init_variables`; nothing is allocated). The task may write its
    vocabulary into `workdir`, as training would."""
    import jax
    import numpy as np
    from bert_jax.tasks import build_task

    task = build_task(config, workdir)
    shapes = jax.eval_shape(task.init_variables, jax.random.PRNGKey(0))
    params = shapes["params"] if "params" in shapes else shapes
    return int(sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(params)))


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")
