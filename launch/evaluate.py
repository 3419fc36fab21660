r"""Evaluates a checkpoint of a workdir in a fresh process.

  python launch/evaluate.py --config=experiments/NAME.py[:ARG] --workdir=DIR \
      [--step=N] [--output=FILE.json]

Restores the parameters of step N (default: the latest checkpoint) and writes
`{"step": N, "eval/...": ...}` as one JSON object to FILE (and the log).
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from absl import app, flags, logging  # noqa: E402

import common_flags as launch_flags  # noqa: E402
from bert_jax.training import evaluation  # noqa: E402

_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
_OUTPUT = flags.DEFINE_string("output", None, "Write the metrics as JSON to this file.")


def main(argv):
    launch_flags.start(argv)
    result = evaluation.evaluate_checkpoint(launch_flags.CONFIG.value,
                                            launch_flags.WORKDIR.value, _STEP.value)
    logging.info("%s", json.dumps(result))
    if _OUTPUT.value:
        with open(_OUTPUT.value, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    launch_flags.run(main)
