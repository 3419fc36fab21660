"""Where a training workdir keeps its checkpoints: `WORKDIR/checkpoints/<step>`
(`CHECKPOINT_DIR`), and which of those steps are complete (`checkpoint_steps`).
It imports only the standard library, so every layer may read the layout: the
tasks (`tasks/base.py`, whether a workdir already holds checkpoints) as well as
training (`training/workdir.py` describes the rest of a workdir's files)."""

import os

CHECKPOINT_DIR = "checkpoints"


def checkpoint_steps(directory: str) -> list[int]:
    """The complete checkpoint steps in a workdir's `checkpoints/` folder,
    ascending (an interrupted save's `N.orbax-checkpoint-tmp*` is not one)."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(d) for d in os.listdir(directory) if d.isdigit())
