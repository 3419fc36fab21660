"""Where a training workdir keeps its checkpoints: `WORKDIR/checkpoints/<step>`
(`CHECKPOINT_DIR`), and which of those steps are complete (`checkpoint_steps`),
and the model dtype of the config its run wrote (`saved_model_dtype`). It imports
only the standard library, so every layer may read the layout: the tasks
(`tasks/base.py`: whether a workdir already holds checkpoints, the dtype 'auto'
keeps) as well as training (`training/workdir.py` describes the rest of a
workdir's files)."""

import json
import os

CHECKPOINT_DIR = "checkpoints"  # one folder a step, named by its number in ASCII digits
CONFIG_FILE = "config.json"     # the resolved config a training run writes


def is_step_name(name: str) -> bool:
    """Whether `name` names a step folder: ASCII digits only (`str.isdigit` takes "²",
    "٣" too, which `int` reads as another step or not at all)."""
    return name.isascii() and name.isdigit()


def checkpoint_steps(directory: str) -> list[int]:
    """The checkpoint steps in a workdir's `checkpoints/` folder, ascending: its entries
    named by `is_step_name` (an interrupted save's `N.orbax-checkpoint-tmp*` is not
    one; `training.workdir.check_step` tells whether one holds a checkpoint)."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(d) for d in os.listdir(directory) if is_step_name(d))


def saved_model_dtype(workdir: str | None) -> str | None:
    """`model.dtype` of the config a run in `workdir` wrote; None without a readable
    one (the trainer's `prepare_workdir` reports a damaged file)."""
    try:
        with open(os.path.join(workdir, CONFIG_FILE)) as f:
            return json.load(f)["model"]["dtype"]
    except (TypeError, OSError, ValueError, KeyError):  # None, missing, damaged
        return None
