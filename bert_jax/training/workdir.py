"""The files of a training workdir, readable without JAX (the sweep runner
reads them while its runs train): the resolved config, the metrics log and the
checkpoint folders `checkpoints/<step>`."""

from __future__ import annotations

import json
import os

CONFIG_FILE = "config.json"     # the resolved config a training run writes
METRICS_FILE = "metrics.jsonl"  # one JSON object a line: {"step": N, "train/loss": ...}
CHECKPOINT_DIR = "checkpoints"


def read_metrics(workdir: str) -> list[dict[str, float]]:
    """The lines of WORKDIR/metrics.jsonl; none when it is absent, and a torn
    line (the trainer is writing it) is skipped."""
    out = []
    try:
        with open(os.path.join(workdir, METRICS_FILE)) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    except OSError:
        pass
    return out


def checkpoint_steps(directory: str) -> list[int]:
    """The complete checkpoint steps in a workdir's `checkpoints/` folder,
    ascending (an interrupted save's `N.orbax-checkpoint-tmp*` is not one)."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(d) for d in os.listdir(directory) if d.isdigit())
