"""The files of a run directory: the runner's JSON records, the trainer's
metrics and checkpoints, the DONE marker, and the parameter count."""

from __future__ import annotations

import datetime
import json
import os
from typing import Any

SWEEP_FILE = "sweep.json"
OVERRIDES_FILE = "overrides.json"
RUN_FILE = "run.json"
DONE_FILE = "DONE"


def _read_json(path: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _write_json(path: str, value: Any) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(value, f, indent=2, sort_keys=False, default=repr)
        f.write("\n")
    os.replace(tmp, path)


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=repr))


def read_metrics(workdir: str) -> list[dict[str, float]]:
    """metrics.jsonl's lines (none if absent; a torn last line is skipped)."""
    path = os.path.join(workdir, "metrics.jsonl")
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    except OSError:
        pass
    return out


def checkpoint_steps(workdir: str) -> list[int]:
    """Steps of the complete checkpoints under WORKDIR/checkpoints."""
    directory = os.path.join(workdir, "checkpoints")
    try:
        return sorted(int(d) for d in os.listdir(directory)
                      if d.isdigit() and os.path.isdir(os.path.join(directory, d)))
    except OSError:
        return []


def is_finished(workdir: str, num_steps: int) -> bool:
    """A DONE marker for at least `num_steps`, or a checkpoint of that step."""
    done = _read_json(os.path.join(workdir, DONE_FILE))
    if isinstance(done, dict) and int(done.get("num_steps", -1)) >= num_steps:
        return True
    return any(step >= num_steps for step in checkpoint_steps(workdir))


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
